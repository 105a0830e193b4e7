"""Peer client: NVIDIA's own ``end_to_end_grpc_client.py`` (tests/peers/, unchanged) against the real
server with the model served as ``tensorrt_llm_bls``, as someone who runs the BLS model would use it.

Then the same model not decoupled (``serving.decoupled: false``): unary HTTP ``/infer`` and gRPC
``ModelInfer`` answer, streaming is refused saying why.

NVIDIA's client runs through ``tests/run_peer.py``, which closes the client the script leaves open
(see there why: without it the script hung at exit about once in a hundred refusals). Every refusal
path of the decoupled model is checked on a bare gRPC stream for its one response carrying the final
flag, without which the stream never closes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from served import Server, start_server, stop_server
from trispec.config import DEFAULT_CONFIG_PATH
from trispec_client import SpecDecClient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

pytestmark = [pytest.mark.server, pytest.mark.real_model]

PEER = Path(__file__).parent / "peers" / "end_to_end_grpc_client.py"
RUN_PEER = Path(__file__).parent / "run_peer.py"
MODEL = "tensorrt_llm_bls"
PROMPT = "The capital of France is"


def serve(tmp: Path, serving: str) -> Server:
    """specdec-serve with the default models and ``serving:`` set as given."""
    config = tmp / "bls.yaml"
    config.write_text(DEFAULT_CONFIG_PATH.read_text() + f"\nserving: {serving}\n")
    return start_server(tmp, "--config", str(config), "--open-admin-apis")


def peer(srv: Server, *args: str, timeout_s: float = 120) -> str:
    """Run NVIDIA's client as its README shows (through run_peer.py, which closes the client it leaves
    open); its stdout (it exits 0 even on a server error)."""
    command = [sys.executable, str(RUN_PEER), str(PEER), "-u", srv.grpc, "--model-name", MODEL, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="class")
def bls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = serve(tmp_path_factory.mktemp("bls"), f"{{model_name: {MODEL}}}")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="class")
def unary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = serve(tmp_path_factory.mktemp("unary"), f"{{model_name: {MODEL}, decoupled: false}}")
    yield srv
    stop_server(srv)


def greedy(srv: Server, prompt: str = PROMPT, **kw: object) -> str:
    """What the model generates greedily, asked through our own client (prompt excluded)."""
    with SpecDecClient(srv.grpc, model=MODEL, timeout_s=120) as client:
        return client.generate(prompt, temperature=0.0, exclude_input_in_output=True, **kw).text  # type: ignore[arg-type]


def check(*expected: str) -> list[str]:
    """The client's own --check-outputs: it asserts every text equals the expected one."""
    return ["--check-outputs", "--expected-outputs", json.dumps(list(expected))]


def bare_stream(
    srv: Server, inputs: dict[str, np.ndarray], parameters: dict[str, object] | None = None
) -> list[service_pb2.ModelStreamInferResponse]:
    """One request on a gRPC stream through tritonclient's generated stub, which shows each response as
    Triton sent it (tritonclient's stream callback drops an error's parameters, the final flag among
    them); the stream half-closes after the request, and every response until Triton ends the call
    comes back. A request that never gets its final response keeps the call open: the deadline then
    fails the test instead of hanging it."""
    request = service_pb2.ModelInferRequest(model_name=MODEL, id="final-flag-check")
    for name, array in inputs.items():
        request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype), shape=list(array.shape))
        raw = serialize_byte_tensor(array).item() if array.dtype == object else array.tobytes()
        request.raw_input_contents.append(raw)
    # a flags-only final response (one sent apart from the error) would then arrive as a response too
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    for key, value in (parameters or {}).items():
        if isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            request.parameters[key].string_param = str(value)
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            return list(stub.ModelStreamInfer(iter([request]), timeout=60))
        except grpc.RpcError as exc:
            pytest.fail(f"the stream did not end in 60 s ({exc.code()}): a response without the final flag?")


def is_final(response: service_pb2.ModelStreamInferResponse) -> bool:
    parameters = response.infer_response.parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def bls_request(prompt: str, **values: object) -> dict[str, np.ndarray]:
    tensors = {"text_input": np.array([[prompt.encode()]], dtype=object)}
    for name, value in values.items():
        dtype = np.float32 if isinstance(value, float) else bool if isinstance(value, bool) else np.int32
        tensors[name] = np.array([[value]], dtype=dtype)
    return tensors


# every way the decoupled model refuses a request: in execute() (bad value, unknown parameter, a prompt
# over serving.max_prompt_bytes) and on the loop thread once tokenised (longer than the context)
REFUSALS = [
    ("beam_width", bls_request("Hi", max_tokens=4, beam_width=2), None, "beam_width: only 1 is supported"),
    ("top_p", bls_request("Hi", max_tokens=4, top_p=1.5), None, "top_p"),
    ("unknown parameter", bls_request("Hi", max_tokens=4), {"temprature": 0.5}, "temprature"),
    ("max_prompt_bytes", bls_request("word " * 60_000, max_tokens=4), None, "serving.max_prompt_bytes"),
    ("context", bls_request("word " * 3000, max_tokens=4), None, "longer than the context"),
]


class TestServedAsTensorrtLlmBls:
    def test_plain_and_exclude_input(self, bls: Server) -> None:
        expected = greedy(bls, max_tokens=16)
        out = peer(bls, "-p", PROMPT, "-o", "16", "--temperature", "0", *check(expected))
        assert f"0: {PROMPT}{expected}\n" in out
        out = peer(bls, "-p", PROMPT, "-o", "16", "--temperature", "0", "--exclude-input-in-output")
        assert f"0: {expected}\n" in out

    def test_streaming(self, bls: Server) -> None:
        expected = greedy(bls, max_tokens=16)
        out = peer(bls, "-p", PROMPT, "-o", "16", "--temperature", "0", "--streaming", *check(expected))
        assert "Received an error" not in out
        assert out.count("0 [b'") > 1  # one printed line per streamed response

    def test_stop_words(self, bls: Server) -> None:
        prompt = "Count: one, two, three,"
        expected = greedy(bls, prompt, max_tokens=32, stop_words=[" five"])
        assert expected and len(expected) < len(greedy(bls, prompt, max_tokens=32))
        args = ["-p", prompt, "-o", "32", "--temperature", "0", "--stop-words", " five"]
        peer(bls, *args, *check(expected))

    def test_return_log_probs(self, bls: Server) -> None:
        out = peer(bls, "-p", PROMPT, "-o", "6", "--temperature", "0", "--return-log-probs")
        assert "output_log_probs.shape: (1, 1, 6)" in out

    def test_return_perf_metrics_streaming_or_not(self, bls: Server) -> None:
        # a prompt no other test sends, nor its first token (partial blocks are reused too): the first
        # request finds nothing cached, the second (the same prompt, streamed) its leading blocks
        prompt = "Zanzibar, the island whose capital is"
        for extra, reused in (([], 0), (["--streaming"], 1)):
            out = peer(bls, "-p", prompt, "-o", "8", "--temperature", "0", "--return-perf-metrics", *extra)
            values = {}
            for line in out.splitlines():
                key, _, value = line.partition(": ")
                if key.endswith(("_ns", "_blocks", "_tokens", "acceptance_rate")):
                    values[key] = float(value)
            times = [
                values[f"{n}_time_ns"] for n in ("arrival", "first_scheduled", "first_token", "last_token")
            ]
            assert times == sorted(times) and times[0] > 1.6e18, out  # wall clock, in order
            assert values["kv_cache_alloc_total_blocks"] >= 1
            assert (values["kv_cache_reused_blocks"] > 0) == bool(reused), out
            assert 0 <= values["total_accepted_draft_tokens"] <= values["total_draft_tokens"]

    def test_num_return_sequences(self, bls: Server) -> None:
        expected = greedy(bls, max_tokens=8)
        out = peer(bls, "-p", PROMPT, "-o", "8", "--temperature", "0", "-n", "2", *check(expected))
        assert f"0 [0]: {PROMPT}{expected}" in out and f"0 [1]: {PROMPT}{expected}" in out
        sampled = peer(bls, "-p", PROMPT, "-o", "8", "-n", "3")
        assert all(f"0 [{i}]: {PROMPT}" in sampled for i in range(3))

    def test_batch_inputs(self, bls: Server) -> None:
        prompts = [PROMPT, "Water boils at"]
        expected = [greedy(bls, p, max_tokens=8) for p in prompts]
        peer(
            bls,
            "-p",
            json.dumps(prompts),
            "-o",
            "8",
            "--temperature",
            "0",
            "--batch-inputs",
            *check(*expected),
        )

    def test_end_id_minus_one_means_none(self, bls: Server) -> None:
        out = peer(bls, "-p", "Hi", "-o", "24", "--temperature", "0", "--end-id", "-1")
        assert "Received an error" not in out and "0: Hi" in out

    def test_what_we_cannot_honour_is_refused_saying_why(self, bls: Server) -> None:
        out = peer(bls, "-p", "Hi", "-o", "4", "--return-generation-logits")
        assert "Received an error from server:\nreturn_generation_logits: not supported: logits" in out
        out = peer(bls, "-p", "Hi", "-o", "4", "--beam-width", "2")
        assert "beam_width: only 1 is supported" in out

    def test_nvidia_client_exits_after_each_refusal(self, bls: Server) -> None:
        """The refusal that hung the client at exit about once in a hundred runs, twenty times over."""
        for _ in range(20):
            out = peer(bls, "-p", "Hi", "-o", "4", "--beam-width", "2", timeout_s=30)
            assert "beam_width: only 1 is supported" in out

    @pytest.mark.parametrize(("case", "inputs", "parameters", "says"), REFUSALS, ids=[r[0] for r in REFUSALS])
    def test_every_refusal_is_one_response_with_the_final_flag(
        self, bls: Server, case: str, inputs: dict[str, np.ndarray], parameters: dict | None, says: str
    ) -> None:
        responses = bare_stream(bls, inputs, parameters)
        assert len(responses) == 1, [r.error_message or "(empty final)" for r in responses]
        assert says in responses[0].error_message, responses[0].error_message
        assert is_final(responses[0]), f"{case}: the error went out without the final flag"

    def test_a_served_request_ends_with_the_final_flag_too(self, bls: Server) -> None:
        responses = bare_stream(bls, bls_request(PROMPT, max_tokens=6, stream=True))
        assert responses and not any(r.error_message for r in responses)
        assert [is_final(r) for r in responses] == [False] * (len(responses) - 1) + [True]


class TestNotDecoupled:
    def test_unary_http_infer_and_grpc_model_infer(self, unary: Server) -> None:
        body = {
            "inputs": [
                {"name": "text_input", "datatype": "BYTES", "shape": [1, 1], "data": [PROMPT]},
                {"name": "max_tokens", "datatype": "INT32", "shape": [1, 1], "data": [8]},
                {"name": "temperature", "datatype": "FP32", "shape": [1, 1], "data": [0.0]},
            ]
        }
        request = urllib.request.Request(
            f"http://{unary.http}/v2/models/{MODEL}/infer", json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            outputs = {o["name"]: o for o in json.load(response)["outputs"]}
        text = outputs["text_output"]["data"][0]
        assert outputs["text_output"]["shape"] == [1] and text.startswith(PROMPT) and len(text) > len(PROMPT)
        assert outputs["finish_reason"]["data"] == ["length"]

        client = grpcclient.InferenceServerClient(unary.grpc)
        inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([[PROMPT.encode()]], dtype=object))
        for name, value in (("max_tokens", 8), ("temperature", 0.0)):
            dtype, triton = (np.int32, "INT32") if isinstance(value, int) else (np.float32, "FP32")
            inputs.append(grpcclient.InferInput(name, [1, 1], triton))
            inputs[-1].set_data_from_numpy(np.array([[value]], dtype=dtype))
        result = client.infer(MODEL, inputs)
        assert result.as_numpy("text_output")[0].decode() == text
        # NVIDIA's client gets its one response too
        assert f"0: {text}\n" in peer(unary, "-p", PROMPT, "-o", "8", "--temperature", "0")

    def test_streaming_is_refused_with_a_clear_message(self, unary: Server) -> None:
        request = urllib.request.Request(
            f"http://{unary.http}/v2/models/{MODEL}/generate",
            json.dumps({"text_input": "x", "max_tokens": 4, "stream": True}).encode(),
            method="POST",
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400
        assert "stream: streaming needs serving.decoupled: true" in refused.value.read().decode()
        out = peer(unary, "-p", "Hi", "-o", "4", "--streaming")
        assert "stream: streaming needs serving.decoupled: true" in out
        with pytest.raises(InferenceServerException, match="num_return_sequences"):
            inputs = [grpcclient.InferInput("text_input", [1, 1], "BYTES")]
            inputs[0].set_data_from_numpy(np.array([[b"Hi"]], dtype=object))
            inputs.append(grpcclient.InferInput("num_return_sequences", [1, 1], "INT32"))
            inputs[1].set_data_from_numpy(np.array([[2]], dtype=np.int32))
            grpcclient.InferenceServerClient(unary.grpc).infer(MODEL, inputs)
