"""End to end: the real tritonserver started by ``specdec-serve``, spoken to through real tritonclient.

One server serves the whole module (start-up loads SmolLM2 once); the test that kills the Python
stub runs last and checks the supervisor brings the server back.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from served import BIN, Server, start_server, stop_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server, pytest.mark.real_model]

MAX_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("serve")
    srv = start_server(tmp, "--admin-key-file", str(tmp / "admin-key"), keep_admin_key_env=False)
    yield srv
    stop_server(srv)


def reference(prompts: list[str], k: int, max_tokens: int = MAX_TOKENS) -> list[str]:
    """What ``specdec-generate`` prints for the same prompts and settings (default config: greedy fp32)."""
    command = [str(BIN / "specdec-generate"), "--json", "--max-tokens", str(max_tokens)]
    command += ["--num-draft-tokens", str(k)]
    for prompt in prompts:
        command += ["--prompt", prompt]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
    return [json.loads(line)["text"] for line in out.splitlines()]


# -- a plain tritonclient gRPC stream, as an existing BLS client would write it --------------------
def bls_inputs(prompt: str | bytes, **values: object) -> list[grpcclient.InferInput]:
    tensors: dict[str, np.ndarray] = {
        "text_input": np.array([[prompt.encode() if isinstance(prompt, str) else prompt]], dtype=object)
    }
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            tensors[name] = value
        elif isinstance(value, bool):
            tensors[name] = np.array([[value]], dtype=bool)
        elif isinstance(value, float):
            tensors[name] = np.array([[value]], dtype=np.float32)
        elif isinstance(value, list):
            tensors[name] = np.array([[v.encode() for v in value]], dtype=object)
        else:
            tensors[name] = np.array([[value]], dtype=np.uint64 if "seed" in name else np.int32)
    inputs = []
    for name, array in tensors.items():
        dtype = {np.dtype(object): "BYTES", np.dtype(bool): "BOOL", np.dtype(np.float32): "FP32"}.get(
            array.dtype, "UINT64" if array.dtype == np.uint64 else "INT32"
        )
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


@dataclass
class StreamResult:
    text: str = ""
    responses: int = 0
    final: dict[str, object] = field(default_factory=dict)
    error: InferenceServerException | None = None


def grpc_stream(
    server: Server,
    prompt: str | bytes,
    timeout_s: float = 120.0,
    cancel_after: int | None = None,
    started: threading.Event | None = None,
    parameters: dict[str, object] | None = None,
    **values: object,
) -> StreamResult:
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    result = StreamResult()
    try:
        client.start_stream(
            callback=lambda result, error: responses.put((result, error)),
            stream_timeout=timeout_s,
        )
        client.async_stream_infer(
            "specdec",
            bls_inputs(prompt, **values),
            enable_empty_final_response=True,
            parameters=parameters,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                response, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no response within {timeout_s} s") from None
            if error is not None:
                result.error = error  # an error ends the request (it carries no final flag)
                return result
            result.responses += 1
            if started is not None:
                started.set()
            text = response.as_numpy("text_output")
            if text is not None:
                result.text += text.reshape(-1)[0].decode()
            if response.get_response().parameters["triton_final_response"].bool_param:
                for name in (
                    "finish_reason",
                    "draft_tokens",
                    "accepted_tokens",
                    "acceptance_rate",
                    "mean_num_draft_tokens",
                ):
                    value = response.as_numpy(name)
                    if value is not None:
                        result.final[name] = value.reshape(-1)[0]
                return result
            if cancel_after is not None and result.responses >= cancel_after:
                client.stop_stream(cancel_requests=True)
                return result
    finally:
        client.close()


# -- 1. the served text is exactly specdec-generate's, over gRPC and HTTP -------------------------
@pytest.mark.parametrize("k", [0, 4])
def test_grpc_and_http_streams_match_specdec_generate(server: Server, k: int) -> None:
    from trispec_client.client import SpecDecClient

    expected = reference(PROMPTS, k)
    for prompt, want in zip(PROMPTS, expected):
        got = grpc_stream(server, prompt, max_tokens=MAX_TOKENS, num_draft_tokens=k, stream=True)
        assert got.error is None, got.error
        assert got.text == want, prompt
        assert got.responses > 1
        assert got.final["finish_reason"] in (b"length", b"stop")
        # the k planned per round: never above the request's, and 0 throughout for plain
        assert 0 <= got.final["mean_num_draft_tokens"] <= k
        if k == 0:
            assert got.final["draft_tokens"] == 0
    http = SpecDecClient(server.http, protocol="http", timeout_s=120)
    for prompt, want in zip(PROMPTS, expected):
        chunks = list(http.stream(prompt, max_tokens=MAX_TOKENS, num_draft_tokens=k))
        assert "".join(c.text for c in chunks) == want, prompt
        assert chunks[-1].final


def test_one_shot_response_carries_prompt_and_text(server: Server) -> None:
    want = reference(PROMPTS[:1], 4)[0]
    got = grpc_stream(server, PROMPTS[0], max_tokens=MAX_TOKENS, stream=False)
    assert got.responses == 1 and got.text == PROMPTS[0] + want
    got = grpc_stream(server, PROMPTS[0], max_tokens=MAX_TOKENS, exclude_input_in_output=True)
    assert got.text == want


def test_specdec_client_cli(server: Server) -> None:
    want = reference(PROMPTS[:1], 4)[0]
    for protocol, url in (("grpc", server.grpc), ("http", server.http)):
        command = [str(BIN / "specdec-client"), "generate", PROMPTS[0], "--url", url, "--protocol", protocol]
        command += ["--max-tokens", str(MAX_TOKENS), "--num-draft-tokens", "4", "--timeout", "120"]
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.rstrip("\n") == want.rstrip("\n")
        assert "accept" in run.stderr


# -- 2. requests join a running batch ----------------------------------------------------------------
class Anchor:
    """A stream that runs until the test cancels it: whatever the test sends meanwhile has to be
    batched with it, however fast or slow the machine (no timing in any assertion)."""

    def __init__(self, server: Server, prompt: str, **values: object) -> None:
        self.started = threading.Event()
        self.results: list[StreamResult] = []
        self.cancel = threading.Event()
        values = {"max_tokens": 1900, "end_id": 49151, "stream": True, **values}  # ends only when cancelled
        self.thread = threading.Thread(target=self._run, args=(server, prompt, values))
        self.thread.start()
        assert self.started.wait(120), "the long stream never started"

    def _run(self, server: Server, prompt: str, values: dict[str, object]) -> None:
        responses: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc)
        result = StreamResult()
        try:
            client.start_stream(
                callback=lambda result, error: responses.put((result, error)), stream_timeout=600
            )
            client.async_stream_infer(
                "specdec", bls_inputs(prompt, **values), enable_empty_final_response=True
            )
            while not self.cancel.is_set():
                try:
                    response, error = responses.get(timeout=0.1)
                except queue.Empty:
                    continue
                if error is not None:
                    result.error = error
                    break
                result.responses += 1
                self.started.set()
                if response.get_response().parameters["triton_final_response"].bool_param:
                    result.final["finished"] = True  # it ended on its own: nothing overlapped it to the end
                    break
            client.stop_stream(cancel_requests=True)
        finally:
            self.results.append(result)
            client.close()

    def stop(self) -> StreamResult:
        self.cancel.set()
        self.thread.join(60)
        assert self.results, "the long stream did not stop"
        return self.results[0]


def test_streams_join_a_running_batch_in_flight(server: Server) -> None:
    """16 streams sent while a long stream runs all finish exact while it is still running, and the
    server's own counters show them sharing verify passes with it. With in-flight batching broken
    (e.g. scheduler.max_batch_size: 1) they would wait behind the long stream: this test fails."""
    prompts = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(16)]
    expected = reference(prompts, 4)
    steps_before = server.metric("specdec_verify_steps_total")
    rounds_before = server.metric("specdec_verify_rounds_total")
    anchor = Anchor(server, "Tell me a very long story about the sea.")
    results: list[StreamResult | BaseException | None] = [None] * 16

    def run(i: int) -> None:
        try:
            results[i] = grpc_stream(
                server, prompts[i], max_tokens=MAX_TOKENS, num_draft_tokens=4, stream=True
            )
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    long = anchor.stop()
    assert long.error is None and "finished" not in long.final, "the long stream ended before the others"
    for i, result in enumerate(results):
        assert isinstance(result, StreamResult) and result.error is None, (i, result)
        assert result.text == expected[i], prompts[i]
    # every round of the 16 shared its verify pass with the long stream (at least), so the rounds
    # exceed the passes by at least one per such round, and each request had one round or more
    steps = server.metric("specdec_verify_steps_total") - steps_before
    rounds = server.metric("specdec_verify_rounds_total") - rounds_before
    assert rounds - steps >= 16, (rounds, steps)


def test_seeded_request_same_text_alone_and_among_seven_others(server: Server) -> None:
    seeded = {
        "max_tokens": MAX_TOKENS,
        "num_draft_tokens": 4,
        "temperature": 0.8,
        "seed": 1234,
        "stream": True,
    }
    alone = grpc_stream(server, PROMPTS[2], **seeded)
    assert alone.error is None and alone.text
    others = [
        # max_tokens: room in the KV pool for all seven (each reserves prompt + max_tokens)
        Anchor(server, prompt, temperature=0.7, seed=100 + i, num_draft_tokens=i % 5, max_tokens=600)
        for i, prompt in enumerate([*PROMPTS, *PROMPTS[:3]])
    ]
    try:
        batched = grpc_stream(server, PROMPTS[2], **seeded)
    finally:
        stopped = [anchor.stop() for anchor in others]
    assert all(s.error is None and "finished" not in s.final for s in stopped)
    assert batched.error is None and batched.text == alone.text
    # a different seed gives different text: the comparison above is not vacuous
    assert grpc_stream(server, PROMPTS[2], **{**seeded, "seed": 4321}).text != alone.text


# -- 3. cancelling one stream -----------------------------------------------------------------------
def wait_until_no_kv_block_is_used(server: Server, seconds: float = 10) -> None:
    """Every pool back to no block in use. (Not "back to the free count read when the test began": the
    previous test's cancelled streams may still hold blocks then, and free them later.)"""
    assert server.has_metric("specdec_kv_blocks_used", pool="target")
    deadline = time.monotonic() + seconds
    while (used := server.metric_or_zero("specdec_kv_blocks_used")) != 0:
        assert time.monotonic() < deadline, f"KV blocks did not return to the pool: {used:g} still used"
        time.sleep(0.05)


def test_cancel_mid_stream_frees_blocks_and_spares_others(server: Server) -> None:
    cancelled_before = server.metric_or_zero("specdec_requests_total", finish_reason="cancelled")
    expected = reference(PROMPTS[1:2], 4, max_tokens=48)[0]
    other: list[StreamResult] = []
    started = threading.Event()
    thread = threading.Thread(
        target=lambda: other.append(
            grpc_stream(server, PROMPTS[1], max_tokens=48, num_draft_tokens=4, stream=True, started=started)
        )
    )
    thread.start()
    assert started.wait(60)
    cut = grpc_stream(server, PROMPTS[2], cancel_after=2, max_tokens=1000, num_draft_tokens=4, stream=True)
    assert cut.error is None and cut.responses == 2
    deadline = time.monotonic() + 10
    while server.metric_or_zero("specdec_requests_total", finish_reason="cancelled") <= cancelled_before:
        assert time.monotonic() < deadline, "the cancelled sequence never left the batch"
        time.sleep(0.02)
    # (that the loop checks cancellation before every round is test_serving_loop's: a bound on
    # rounds counted here would depend on how fast this test polls)
    thread.join(120)
    assert other and other[0].error is None and other[0].text == expected
    wait_until_no_kv_block_is_used(server)
    assert server.metric("specdec_running_sequences") == 0


def test_http_client_disconnect_cancels(server: Server) -> None:
    from trispec_client.client import SpecDecClient

    cancelled_before = server.metric_or_zero("specdec_requests_total", finish_reason="cancelled")
    client = SpecDecClient(server.http, protocol="http", timeout_s=60)
    with contextlib.closing(client.stream(PROMPTS[2], max_tokens=1000, end_id=49151)) as stream:
        for count, _chunk in enumerate(stream, 1):
            if count == 2:
                break  # closing the stream closes the connection
    deadline = time.monotonic() + 10
    while server.metric_or_zero("specdec_requests_total", finish_reason="cancelled") <= cancelled_before:
        assert time.monotonic() < deadline, "a disconnected HTTP client's sequence kept running"
        time.sleep(0.05)
    wait_until_no_kv_block_is_used(server)


# -- 5. bad requests --------------------------------------------------------------------------------
# (field, text_input, other gRPC tensors, the same request as generate_stream JSON where JSON can say it)
LONG_PROMPT = "word " * 2500  # longer than the 2048-token context
BAD_REQUESTS: list[tuple[str, str | bytes, dict[str, object], dict[str, object] | None]] = [
    ("text_input", "", {}, {"text_input": ""}),
    ("text_input", b"\xff\xfe", {}, None),
    ("text_input", LONG_PROMPT, {}, {"text_input": LONG_PROMPT}),
    ("max_tokens", "hi", {"max_tokens": 0}, {"max_tokens": 0}),
    ("max_tokens", "hi", {"max_tokens": -5}, {"max_tokens": -5}),
    ("max_tokens", "hi", {"max_tokens": 1_000_000}, {"max_tokens": 1_000_000}),
    ("num_draft_tokens", "hi", {"num_draft_tokens": -1}, {"num_draft_tokens": -1}),
    ("num_draft_tokens", "hi", {"num_draft_tokens": 99}, {"num_draft_tokens": 99}),
    ("temperature", "hi", {"temperature": -0.5}, {"temperature": -0.5}),
    ("temperature", "hi", {"temperature": float("nan")}, None),
    ("top_p", "hi", {"top_p": 1.5}, {"top_p": 1.5}),
    ("top_p", "hi", {"top_p": 0.0}, {"top_p": 0.0}),
    ("top_k", "hi", {"top_k": -1}, {"top_k": -1}),
    ("end_id", "hi", {"end_id": 10_000_000}, {"end_id": 10_000_000}),
    ("end_id", "hi", {"end_id": -2}, {"end_id": -2}),  # -1 is valid: no end id
    ("max_tokens", "hi", {"max_tokens": 2048}, {"max_tokens": 2048}),  # 1 prompt token + 2048 > context
    ("beam_width", "hi", {"beam_width": 2}, {"beam_width": 2}),
    ("seed", "hi", {"seed": 1, "random_seed": 2}, {"seed": 1, "random_seed": 2}),
    ("stop_words", "hi", {"stop_words": np.array([[b"\xc3"]], dtype=object)}, None),
    # refused by Triton's own input checks (then the message names the input, no model involved)
    ("max_tokens_dtype", "hi", {"max_tokens": np.array([[1.5]], dtype=np.float32)}, None),
    ("no_such_input", "hi", {"no_such_input": 3}, None),
]


def test_bad_requests_are_refused_naming_the_field(server: Server) -> None:
    """Every kind over a gRPC stream, whose error must name the field, and, where JSON can say it, over
    HTTP generate_stream, which must answer 400 naming the field. (A gRPC stream error carries no
    status code in Triton 2.51 unless the ``triton_grpc_error`` header is sent, and the server
    crashed on that path, so the code is checked over HTTP.)"""
    import urllib3

    expected = reference(PROMPTS[3:4], 4, max_tokens=40)[0]
    good: list[StreamResult] = []
    thread = threading.Thread(
        target=lambda: good.append(grpc_stream(server, PROMPTS[3], max_tokens=40, stream=True))
    )
    thread.start()
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30))
    http_400 = 0
    for field_name, prompt, values, body in BAD_REQUESTS:
        result = grpc_stream(server, prompt, timeout_s=30, **values)
        assert result.error is not None and result.responses == 0, (field_name, values)
        named = field_name.removesuffix("_dtype")
        assert named in result.error.message(), (field_name, result.error.message())
        if body is not None:
            body = {"text_input": prompt, **body} if isinstance(prompt, str) else body
            url = f"http://{server.http}/v2/models/specdec/generate_stream"
            resp = http.request("POST", url, json=body)
            assert resp.status == 400, (field_name, resp.status, resp.data[:200])
            assert field_name in resp.data.decode(), (field_name, resp.data[:200])
            http_400 += 1
    assert http_400 >= 15
    thread.join(120)
    assert good and good[0].error is None and good[0].text == expected
    assert server.ready()


# -- 4. refusals are explicit and counted; admin APIs need the key -----------------------------------
def test_unknown_keys_and_oversized_prompts_are_refused_and_counted(server: Server) -> None:
    import urllib3

    reasons = ("unknown_parameter", "too_long", "invalid_input")
    before = {r: server.metric_or_zero("specdec_requests_rejected_total", reason=r) for r in reasons}
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30))
    url = f"http://{server.http}/v2/models/specdec/generate_stream"
    # a misspelled JSON key becomes a request parameter in Triton: refused naming it, not ignored
    resp = http.request("POST", url, json={"text_input": "hi", "max_token": 4})
    assert resp.status == 400 and "max_token" in resp.data.decode(), resp.data[:300]
    over_grpc = grpc_stream(server, "hi", timeout_s=30, parameters={"temprature": 0.5})
    assert over_grpc.error is not None and "temprature" in over_grpc.error.message()
    # refused on its byte size, before it is tokenised
    huge = grpc_stream(server, "word " * 100_000, timeout_s=30)
    assert huge.error is not None and "serving.max_prompt_bytes" in huge.error.message()
    bad = grpc_stream(server, "hi", timeout_s=30, top_p=1.5)
    assert bad.error is not None and "top_p" in bad.error.message()
    after = {r: server.metric("specdec_requests_rejected_total", reason=r) for r in reasons}
    assert after["unknown_parameter"] - before["unknown_parameter"] == 2
    assert after["too_long"] - before["too_long"] == 1
    assert after["invalid_input"] - before["invalid_input"] == 1
    assert "refused request" in server.log.read_text() and "word word" not in server.log.read_text()


ADMIN_HTTP = [
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
    ("POST", "/v2/repository/index"),
]


def test_admin_apis_need_the_key_inference_and_health_do_not(server: Server) -> None:
    import urllib3

    key = server.admin_key_file.read_text().strip()
    assert key and server.admin_key_file.stat().st_mode & 0o777 == 0o600
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30))
    for method, path in ADMIN_HTTP:
        refused = http.request(method, f"http://{server.http}{path}")
        assert refused.status == 403, (path, refused.status, refused.data[:200])
        allowed = http.request(method, f"http://{server.http}{path}", headers={"specdec-admin-key": key})
        assert allowed.status == 200, (path, allowed.status, allowed.data[:200])
        wrong = http.request(method, f"http://{server.http}{path}", headers={"specdec-admin-key": "x"})
        assert wrong.status == 403, path
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        calls = (client.get_log_settings, client.get_system_shared_memory_status, client.get_trace_settings)
        for call in calls:
            with pytest.raises(InferenceServerException, match="restricted"):
                call()
            # Triton's gRPC side expects the header under its own prefix
            call(headers={"triton-grpc-protocol-specdec-admin-key": key})
        assert client.is_server_ready() and client.get_model_metadata("specdec")
    finally:
        client.close()
    assert grpc_stream(server, "hi", max_tokens=2).error is None  # inference stays open


def test_shm_regions_are_owner_only(server: Server) -> None:
    regions = list(Path("/dev/shm").glob(f"specdec_{server.process.pid}_*"))
    assert regions
    assert all(path.stat().st_mode & 0o777 == 0o600 for path in regions), [
        (p.name, oct(p.stat().st_mode)) for p in regions
    ]


# -- 5. killing the Python stub (last: it restarts the server) ---------------------------------------
def test_killed_stub_errors_clients_and_supervisor_restarts(server: Server) -> None:
    from trispec.serving.tritonserver import find_stubs

    want = reference(PROMPTS[:1], 4, max_tokens=8)[0]
    stubs = find_stubs(server.process.pid)
    assert stubs, "no Python stub process found under the launcher"
    started = threading.Event()
    results: list[StreamResult | BaseException] = []

    def long_stream() -> None:
        try:
            # streamed, and ended only by max_tokens (end_id: an id SmolLM2 never emits here)
            long = {"max_tokens": 1500, "end_id": 49151, "stream": True}
            results.append(grpc_stream(server, PROMPTS[0], timeout_s=30, started=started, **long))
        except BaseException as exc:  # a timeout is a failure of the test below, not of the thread
            results.append(exc)

    thread = threading.Thread(target=long_stream)
    thread.start()
    assert started.wait(60)
    killed_at = time.monotonic()
    for stub in stubs:
        os.kill(stub.pid, signal.SIGKILL)
    thread.join(40)
    assert results, "the client is still waiting"
    outcome = results[0]
    assert isinstance(outcome, StreamResult) and outcome.error is not None, outcome
    assert time.monotonic() - killed_at < 30

    # back within 30 s of the kill: a new request succeeds
    last: object = None
    while time.monotonic() - killed_at < 30:
        if server.ready():
            try:
                got = grpc_stream(server, PROMPTS[0], timeout_s=10, max_tokens=8, stream=True)
            except TimeoutError as exc:
                last = exc
            else:
                if got.error is None:
                    assert got.text == want
                    break
                last = got.error
        time.sleep(0.5)
    else:
        pytest.fail(f"server not serving again 30 s after the stub was killed: {last}")
    assert server.process.poll() is None
