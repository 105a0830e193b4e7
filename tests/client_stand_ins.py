"""What the trispec_client tests (``test_client_*.py``) stand on: a scripted SSE server on a local port
(real sockets, real urllib3), a stand-in for tritonclient's gRPC InferenceServerClient fed real
InferResults, a stand-in client for the CLI, and a transport that answers from a script (retries,
resumes). The fixtures are registered for every test by ``conftest.py``.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from trispec_client import (
    Completion,
    GenerationRequest,
    SpecDecClient,
    SpecDecError,
    SpeculationStats,
    StreamChunk,
    cli,
)
from trispec_client.results import collect
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

FINAL_EVENT = {
    "model_name": "specdec",
    "model_version": "1",
    "text_output": "",
    "output_token_count": 3,
    "finish_reason": "length",
    "draft_tokens": 12,
    "accepted_tokens": 9,
    "verify_rounds": 4,
    "acceptance_rate": 0.75,
    "mean_accepted_length": 3.25,
    "mean_num_draft_tokens": 3.0,
}


STATS = SpeculationStats(12, 9, 4, 0.75, 3.25, 3.0)


def _infer_result(outputs: dict[str, Any], *, final: bool | None) -> InferResult:
    """A real tritonclient InferResult, as the gRPC stream hands it to the callback."""
    response = service_pb2.ModelInferResponse(model_name="specdec")
    for name, value in outputs.items():
        tensor = response.outputs.add()
        tensor.name = name
        tensor.shape.extend([1, 1])
        if isinstance(value, str):
            tensor.datatype = "BYTES"
            raw = serialize_byte_tensor(np.array([[value.encode()]], dtype=np.object_)).item()
        elif isinstance(value, float):
            tensor.datatype = "FP32"
            raw = np.array([[value]], np.float32).tobytes()
        else:
            tensor.datatype = "INT32"
            raw = np.array([[value]], np.int32).tobytes()
        response.raw_output_contents.append(raw)
    if final is not None:
        response.parameters["triton_final_response"].bool_param = final
    return InferResult(response)


# the model's retryable refusals, as python_backend/trispec/serving/loop.py words them
QUEUE_FULL = "1 requests are waiting for a slot (scheduler.max_waiting 1) and this one brings 1; retry later"


QUEUE_TIMEOUT = "no slot within scheduler.max_queue_delay_s (5 s); 3 requests were waiting; retry later"


@dataclass
class Script:
    """What the local server answers: status, content type, and (delay, bytes) writes."""

    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"
    writes: list[tuple[float, bytes]] = field(default_factory=list)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)


def sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


@pytest.fixture
def sse_server() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            script.requests.append((self.path, json.loads(body)))
            self.send_response(script.status)
            self.send_header("Content-Type", script.content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for delay, data in script.writes:
                    time.sleep(delay)
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                script.disconnected.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


class FakeGrpcClient:
    """Stands in for tritonclient.grpc.InferenceServerClient; ``script`` is what the stream delivers."""

    script: ClassVar[list[tuple[InferResult | None, InferenceServerException | None]]] = []
    instances: ClassVar[list[FakeGrpcClient]] = []

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: list[tuple[str, dict[str, Any]]] = []
        FakeGrpcClient.instances.append(self)

    def start_stream(self, callback: Any, stream_timeout: float | None = None, headers: Any = None) -> None:
        self.callback = callback
        self.calls.append(("start_stream", {"stream_timeout": stream_timeout, "headers": headers}))

    def async_stream_infer(self, model_name: str, inputs: list[Any], **kwargs: Any) -> None:
        self.calls.append(("async_stream_infer", {"model_name": model_name, "inputs": inputs, **kwargs}))
        for result, error in self.script:
            self.callback(result=result, error=error)

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.calls.append(("stop_stream", {"cancel_requests": cancel_requests}))

    def close(self) -> None:
        self.calls.append(("close", {}))

    def call(self, name: str) -> dict[str, Any]:
        return next(kwargs for called, kwargs in self.calls if called == name)


@pytest.fixture
def fake_grpc(monkeypatch: pytest.MonkeyPatch) -> type[FakeGrpcClient]:
    FakeGrpcClient.script = []
    FakeGrpcClient.instances = []
    monkeypatch.setattr(grpcclient, "InferenceServerClient", FakeGrpcClient)
    return FakeGrpcClient


def _final_result() -> InferResult:
    return _infer_result({k: v for k, v in FINAL_EVENT.items() if not k.startswith("model")}, final=True)


class FakeClient:
    """Stands in for SpecDecClient in CLI tests; ``outcome`` is a list of chunks or an exception."""

    outcome: ClassVar[list[StreamChunk] | SpecDecError] = []
    made: ClassVar[list[FakeClient]] = []

    def __init__(
        self,
        url: str | None,
        protocol: str,
        model: str,
        timeout_s: float,
        retries: int,
        resume: bool,
        resume_timeout_s: float,
        routing: str,
        route_prefix_chars: int,
    ) -> None:
        self.init = {
            "url": url,
            "protocol": protocol,
            "model": model,
            "timeout_s": timeout_s,
            "retries": retries,
            "resume": resume,
            "resume_timeout_s": resume_timeout_s,
            "routing": routing,
            "route_prefix_chars": route_prefix_chars,
        }
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.closed_early = False
        FakeClient.made.append(self)

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def stream(self, prompt: str, **kwargs: Any) -> Iterator[StreamChunk]:
        self.calls.append(("stream", prompt, kwargs))
        return self._chunks()

    def _chunks(self) -> Iterator[StreamChunk]:
        try:
            if isinstance(self.outcome, SpecDecError):
                yield StreamChunk("partial", 1)
                raise self.outcome
            yield from self.outcome
        except GeneratorExit:
            self.closed_early = True
            raise

    def generate(self, prompt: str, **kwargs: Any) -> Completion:
        self.calls.append(("generate", prompt, kwargs))
        if isinstance(self.outcome, SpecDecError):
            raise self.outcome
        return collect(self.outcome)


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.outcome = [
        StreamChunk("Paris", 1),
        StreamChunk(" is", 2),
        StreamChunk("", 2, final=True, finish_reason="length", stats=STATS),
    ]
    FakeClient.made = []
    monkeypatch.setattr(cli, "SpecDecClient", FakeClient)
    return FakeClient


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


class Attempts:
    """Each call is one attempt: the next outcome, an error raised before any chunk or chunks."""

    def __init__(self, *outcomes: SpecDecError | list[StreamChunk]) -> None:
        self.outcomes = list(outcomes)
        self.given: list[float] = []
        self.replicas: list[int] = []
        self.closed = 0

    def __call__(self, timeout_s: float, replica: int = 0) -> Iterator[StreamChunk]:
        self.given.append(timeout_s)
        self.replicas.append(replica)
        return self._run(self.outcomes.pop(0))

    def _run(self, outcome: SpecDecError | list[StreamChunk]) -> Iterator[StreamChunk]:
        try:
            if isinstance(outcome, SpecDecError):
                raise outcome
            yield from outcome
        finally:
            self.closed += 1


CHUNKS = [StreamChunk("a", 1), StreamChunk("", 1, final=True)]


class Fleet:
    """Stand-in replicas for ``SpecDecClient``: per replica, the chunks (or error) of each attempt
    sent there, and whether its model is ready."""

    def __init__(
        self, client: SpecDecClient, monkeypatch: pytest.MonkeyPatch, **replicas: list[object]
    ) -> None:
        self.outcomes = {int(name[1:]): list(v) for name, v in replicas.items()}
        self.ready = {i: True for i in self.outcomes}
        self.sent: list[tuple[int, GenerationRequest]] = []
        monkeypatch.setattr(client.replicas, "attempt", self.attempt)
        monkeypatch.setattr(client.replicas, "model_ready", lambda i, timeout_s: self.ready[i])

    def attempt(self, index: int, request: GenerationRequest, timeout_s: float) -> Iterator[StreamChunk]:
        self.sent.append((index, request))
        outcome = self.outcomes[index].pop(0)

        def run() -> Iterator[StreamChunk]:
            for item in outcome if isinstance(outcome, list) else [outcome]:
                if isinstance(item, Exception):
                    raise item
                yield item  # type: ignore[misc]

        return run()
