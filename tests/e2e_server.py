"""The real tritonserver started by ``specdec-serve`` (default config: SmolLM2) that the end-to-end
files ``test_server_*.py`` share: one per test session (per pytest-xdist worker), started by the
first test that asks for it (fixture ``e2e_server``, registered for every test by ``conftest.py``);
and what they use to talk to it: ``specdec-generate``'s text for the same prompts, a plain
tritonclient gRPC stream as an existing BLS client would write it, a long stream to join.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from served import BIN, Server, start_server, stop_server
from tritonclient.utils import InferenceServerException

MAX_TOKENS = 24


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at",
]


@contextmanager
def e2e_server_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default-config server (admin APIs behind a key file), stopped cleanly after the block."""
    tmp = tmp_path_factory.mktemp("serve")
    srv = start_server(tmp, "--admin-key-file", str(tmp / "admin-key"), keep_admin_key_env=False)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def e2e_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with e2e_server_in(tmp_path_factory) as srv:
        yield srv


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


# -- 3. cancelling one stream -----------------------------------------------------------------------
def wait_until_no_kv_block_is_used(server: Server, seconds: float = 10) -> None:
    """Every pool back to no block in use. (Not "back to the free count read when the test began": the
    previous test's cancelled streams may still hold blocks then, and free them later.)"""
    assert server.has_metric("specdec_kv_blocks_used", pool="target")
    deadline = time.monotonic() + seconds
    while (used := server.metric_or_zero("specdec_kv_blocks_used")) != 0:
        assert time.monotonic() < deadline, f"KV blocks did not return to the pool: {used:g} still used"
        time.sleep(0.05)
