"""trispec_client without Triton: inputs, SSE parsing, response conversion, transports, CLI.

The HTTP transport runs against a small scripted SSE server on a local port (real sockets, real urllib3);
the gRPC transport against a stand-in for tritonclient's InferenceServerClient fed real InferResults.
"""

from __future__ import annotations

import io
import json
import math
import socket
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
    InvalidRequestError,
    SpecDecClient,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecOverloadedError,
    SpecDecTimeoutError,
    SpeculationStats,
    StreamChunk,
    cli,
    grpc_transport,
)
from trispec_client.client import _with_retries
from trispec_client.errors import SpecDecResumeError, make_error, status_from_message
from trispec_client.http_transport import error_from_response, event_to_chunk
from trispec_client.results import chunk_from_outputs, collect
from trispec_client.sse import SSEParser
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


# ---------------------------------------------------------------- request inputs


def test_only_the_inputs_the_caller_set_are_sent() -> None:
    assert GenerationRequest("hi").sent_values() == {"text_input": "hi", "stream": True}
    values = GenerationRequest("hi", max_tokens=5, top_p=0.9, stream=False).sent_values()
    assert values == {"text_input": "hi", "max_tokens": 5, "top_p": 0.9, "stream": False}


def test_grpc_tensors_have_the_model_names_dtypes_and_batch_dimension() -> None:
    request = GenerationRequest(
        "héllo",
        max_tokens=7,
        num_draft_tokens=0,
        temperature=0.5,
        top_k=40,
        top_p=0.9,
        seed=2**64 - 1,
        end_id=2,
        stop_words=["\n\n", "END"],
        bad_words=["x"],
        exclude_input_in_output=True,
    )
    tensors = {t.name: t for t in request.tensors()}
    expected = {
        "text_input": ("BYTES", np.object_, (1, 1)),
        "max_tokens": ("INT32", np.int32, (1, 1)),
        "num_draft_tokens": ("INT32", np.int32, (1, 1)),
        "temperature": ("FP32", np.float32, (1, 1)),
        "top_k": ("INT32", np.int32, (1, 1)),
        "top_p": ("FP32", np.float32, (1, 1)),
        "seed": ("UINT64", np.uint64, (1, 1)),
        "end_id": ("INT32", np.int32, (1, 1)),
        "stop_words": ("BYTES", np.object_, (1, 2)),
        "bad_words": ("BYTES", np.object_, (1, 1)),
        "stream": ("BOOL", np.bool_, (1, 1)),
        "exclude_input_in_output": ("BOOL", np.bool_, (1, 1)),
    }
    assert set(tensors) == set(expected)
    for name, (datatype, dtype, shape) in expected.items():
        assert tensors[name].datatype == datatype, name
        assert tensors[name].array.dtype == dtype, name
        assert tensors[name].array.shape == shape, name
    assert tensors["text_input"].array[0, 0] == "héllo".encode()
    assert tensors["stop_words"].array.tolist() == [[b"\n\n", b"END"]]
    assert int(tensors["seed"].array[0, 0]) == 2**64 - 1
    assert tensors["max_tokens"].array[0, 0] == 7


def test_grpc_infer_inputs_carry_name_datatype_shape() -> None:
    inputs = grpc_transport.infer_inputs(GenerationRequest("hi", max_tokens=3, stop_words=["a", "b", "c"]))
    described = [(i.name(), i.datatype(), i.shape()) for i in inputs]
    assert described == [
        ("text_input", "BYTES", [1, 1]),
        ("max_tokens", "INT32", [1, 1]),
        ("stream", "BOOL", [1, 1]),
        ("stop_words", "BYTES", [1, 3]),
    ]


def test_json_body_for_generate_stream() -> None:
    request = GenerationRequest(
        "hi", max_tokens=np.int64(4), temperature=0.0, seed=7, stop_words=("x", "y"), stream=False
    )
    body = request.json_body()
    assert body == {
        "text_input": "hi",
        "max_tokens": 4,
        "temperature": 0.0,
        "seed": 7,
        "stream": False,
        "stop_words": ["x", "y"],
    }
    assert json.loads(json.dumps(body)) == body  # numpy scalars were turned into plain ones


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"top_k": "4"}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": math.inf}, "top_p"),
        ({"top_p": "0.5"}, "top_p"),
        ({"stop_words": [""]}, "stop_words"),
        ({"bad_words": [3]}, "bad_words"),
        ({"stream": 1}, "stream"),
    ],
)
def test_values_that_cannot_be_carried_fail_naming_the_field(fields: dict[str, Any], field_name: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        GenerationRequest("hi", **fields)
    assert info.value.message.startswith(f"{field_name}:")
    assert info.value.status == "INVALID_ARGUMENT"


def test_a_bare_stop_string_is_one_word_not_characters() -> None:
    assert GenerationRequest("hi", stop_words="END").stop_words == ("END",)  # type: ignore[arg-type]


def test_prompt_must_be_text() -> None:
    with pytest.raises(InvalidRequestError, match="text_input"):
        GenerationRequest(b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------- responses → chunks


def test_chunk_from_grpc_arrays() -> None:
    outputs = {
        "text_output": np.array([[b" world"]], dtype=np.object_),
        "output_token_count": np.array([[2]], dtype=np.int32),
    }
    chunk = chunk_from_outputs(outputs, final=False)
    assert chunk == StreamChunk(text=" world", token_count=2)
    assert type(chunk.token_count) is int


def test_final_chunk_carries_reason_and_stats() -> None:
    outputs = {k: np.array([[v.encode() if isinstance(v, str) else v]]) for k, v in FINAL_EVENT.items()}
    chunk = chunk_from_outputs(outputs, final=True)
    assert chunk.final and chunk.finish_reason == "length" and chunk.token_count == 3
    assert chunk.stats == STATS


def test_empty_final_response_keeps_the_count() -> None:
    chunk = chunk_from_outputs({}, final=True, previous_token_count=9)
    assert chunk == StreamChunk(text="", token_count=9, final=True)


def test_collect_joins_text_and_takes_the_final_totals() -> None:
    chunks = [
        StreamChunk("Hel", 1),
        StreamChunk("lo", 2),
        StreamChunk("", 2, final=True, finish_reason="stop", stats=STATS),
    ]
    assert collect(chunks) == Completion("Hello", 2, "stop", STATS)


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


def test_grpc_response_outputs_and_final_flag() -> None:
    outputs, final = grpc_transport.response_outputs(
        _infer_result({"text_output": "hi", "output_token_count": 1}, final=False)
    )
    assert not final
    assert chunk_from_outputs(outputs, final=final) == StreamChunk("hi", 1)
    _, final = grpc_transport.response_outputs(_infer_result({}, final=True))
    assert final
    _, final = grpc_transport.response_outputs(_infer_result({"text_output": "x"}, final=None))
    assert not final  # no parameter: not final


# ---------------------------------------------------------------- SSE parsing


def test_sse_events_split_at_every_byte_give_the_same_events() -> None:
    stream = (
        'data: {"text_output":"h\u00e9"}\n\n'
        ": keep-alive comment\r\n"
        'event: message\r\ndata: {"a":1}\r\n\r\n'
        "data:no-space\n\n"
        "data: line1\ndata: line2\n\n"
    ).encode()
    expected = ['{"text_output":"hé"}', '{"a":1}', "no-space", "line1\nline2"]
    whole = SSEParser()
    assert whole.feed(stream) + whole.close() == expected
    for cut in range(1, len(stream)):
        parser = SSEParser()
        events = parser.feed(stream[:cut]) + parser.feed(stream[cut:]) + parser.close()
        assert events == expected, cut
    one_by_one = SSEParser()
    events = [event for i in range(len(stream)) for event in one_by_one.feed(stream[i : i + 1])]
    assert events == expected


def test_sse_event_cut_off_by_the_end_is_kept() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"x":1}\n\ndata: {"y"') == ['{"x":1}']
    assert parser.feed(b":2}") == []
    assert parser.close() == ['{"y":2}']


def test_sse_event_to_chunk() -> None:
    chunk = event_to_chunk(
        json.dumps({"model_name": "specdec", "text_output": "ab", "output_token_count": 2}), 0
    )
    assert chunk == StreamChunk("ab", 2)
    final = event_to_chunk(json.dumps(FINAL_EVENT), 2)
    assert final.final and final.stats == STATS and final.finish_reason == "length"


def test_sse_error_event_raises_typed_error() -> None:
    with pytest.raises(InvalidRequestError) as info:
        event_to_chunk('{"error": "top_p: must be in (0, 1]"}', 0)
    assert info.value.message == "top_p: must be in (0, 1]"
    with pytest.raises(SpecDecError) as info:
        event_to_chunk('{"error": "engine exploded"}', 0)
    assert not isinstance(info.value, InvalidRequestError)
    assert info.value.status == "UNKNOWN"
    with pytest.raises(SpecDecError, match="not JSON"):
        event_to_chunk("{oops", 0)


def test_status_from_message_only_trusts_a_leading_field_name() -> None:
    assert status_from_message("max_tokens: must be > 0") == "INVALID_ARGUMENT"
    assert status_from_message("internal: max_tokens: broke") == "UNKNOWN"
    assert status_from_message("top_pp: x") == "UNKNOWN"


# the model's retryable refusals, as python_backend/trispec/serving/loop.py words them
QUEUE_FULL = "1 requests are waiting for a slot (scheduler.max_waiting 1) and this one brings 1; retry later"
QUEUE_TIMEOUT = "no slot within scheduler.max_queue_delay_s (5 s); 3 requests were waiting; retry later"


@pytest.mark.parametrize("message", [QUEUE_FULL, QUEUE_TIMEOUT, "the model is shutting down"])
def test_the_models_refusals_for_now_are_unavailable_and_retryable(message: str) -> None:
    assert status_from_message(message) == "UNAVAILABLE"
    error = make_error(message, status_from_message(message))
    assert isinstance(error, SpecDecOverloadedError) and error.retryable
    assert status_from_message("retry later: not at the end") == "UNKNOWN"
    assert not make_error("engine exploded", "UNKNOWN").retryable


@pytest.mark.parametrize(
    ("status", "content_type", "body", "kind", "expected_status"),
    [
        (
            400,
            "text/event-stream",
            b'data: {"error":"top_p: must be in (0, 1]"}\n\n',
            InvalidRequestError,
            None,
        ),
        # Triton answers 400 for any error in the first response: classified by the message
        (400, "text/event-stream", b'data: {"error":"engine exploded"}\n\n', SpecDecError, "UNKNOWN"),
        (400, "application/json", b'{"error":"unexpected inference input \'x\'"}', InvalidRequestError, None),
        (404, "application/json", b'{"error":"Request for unknown model"}', SpecDecError, "NOT_FOUND"),
        (500, "application/json", b'{"error":"boom"}', SpecDecError, "INTERNAL"),
        (503, "text/plain", b"down", SpecDecConnectionError, "UNAVAILABLE"),
        # a full queue: sent as UNAVAILABLE, answered 400 by Triton 2.51's generate(_stream)
        (
            400,
            "text/event-stream",
            f'data: {{"error": "{QUEUE_FULL}"}}\n\n'.encode(),
            SpecDecOverloadedError,
            "UNAVAILABLE",
        ),
        (
            400,
            "application/json",
            json.dumps({"error": QUEUE_FULL}).encode(),
            SpecDecOverloadedError,
            "UNAVAILABLE",
        ),
        (502, "text/html", b"", SpecDecError, "HTTP_502"),
    ],
)
def test_http_error_replies_become_typed_errors(
    status: int, content_type: str, body: bytes, kind: type, expected_status: str | None
) -> None:
    error = error_from_response(status, content_type, body)
    assert type(error) is kind
    assert error.http_status == status
    if expected_status is not None:
        assert error.status == expected_status
    assert error.message  # never empty, even for an empty body


# ---------------------------------------------------------------- HTTP transport against a local SSE server


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


def test_http_stream_yields_chunks_and_sends_only_set_inputs(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    first = sse({"model_name": "specdec", "text_output": "Hel", "output_token_count": 1})
    # the second event arrives split over two writes, mid-way through a UTF-8 character
    second = sse({"text_output": "lö", "output_token_count": 2})
    cut = second.index("ö".encode()) + 1
    script.writes = [(0, first), (0.02, second[:cut]), (0.02, second[cut:]), (0, sse(FINAL_EVENT))]
    client = SpecDecClient(url, protocol="http", timeout_s=5)
    chunks = list(client.stream("Hi", max_tokens=3, stop_words=["\n"]))
    assert [c.text for c in chunks] == ["Hel", "lö", ""]
    assert [c.final for c in chunks] == [False, False, True]
    assert chunks[-1].stats == STATS
    path, body = script.requests[0]
    assert path == "/v2/models/specdec/generate_stream"
    assert body == {"text_input": "Hi", "max_tokens": 3, "stream": True, "stop_words": ["\n"]}


def test_http_generate_sends_stream_false(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.writes = [(0, sse({**FINAL_EVENT, "text_output": "Hi there"}))]
    completion = SpecDecClient(url, protocol="http", model="other", timeout_s=5).generate(
        "Hi", exclude_input_in_output=False
    )
    assert completion == Completion("Hi there", 3, "length", STATS)
    path, body = script.requests[0]
    assert path == "/v2/models/other/generate_stream"
    assert body == {"text_input": "Hi", "stream": False, "exclude_input_in_output": False}


def test_http_clean_end_without_final_event_still_ends_with_a_final_chunk(
    sse_server: tuple[str, Script],
) -> None:
    url, script = sse_server
    script.writes = [(0, sse({"text_output": "a", "output_token_count": 1}))]
    chunks = list(SpecDecClient(url, protocol="http", timeout_s=5).stream("x"))
    assert chunks == [StreamChunk("a", 1), StreamChunk("", 1, final=True)]


def test_http_error_event_mid_stream_raises_after_the_text_so_far(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.writes = [
        (0, sse({"text_output": "a", "output_token_count": 1})),
        (0, sse({"error": "engine exploded"})),
    ]
    received = []
    with pytest.raises(SpecDecError, match="engine exploded") as info:
        for chunk in SpecDecClient(url, protocol="http", timeout_s=5).stream("x"):
            received.append(chunk.text)
    assert received == ["a"]
    assert info.value.http_status == 200


def test_http_400_from_the_model_is_invalid_request(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.status = 400
    script.writes = [(0, sse({"error": "top_p: must be in (0, 1]"}))]
    with pytest.raises(InvalidRequestError) as info:
        list(SpecDecClient(url, protocol="http", timeout_s=5).stream("x", top_p=2.0))
    assert info.value.http_status == 400
    assert info.value.message == "top_p: must be in (0, 1]"


def test_http_breaking_out_of_the_loop_closes_the_connection(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    # 100 events 50 ms apart: only a closed connection makes the server's writes fail within 2 s
    script.writes = [(0.05, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(100)]
    for _chunk in SpecDecClient(url, protocol="http", timeout_s=10).stream("x"):
        break
    assert script.disconnected.wait(2.0)


def test_http_stalled_server_times_out(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.writes = [(0, sse({"text_output": "a", "output_token_count": 1})), (3.0, sse(FINAL_EVENT))]
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError) as info:
        list(SpecDecClient(url, protocol="http", timeout_s=0.4).stream("x"))
    assert time.monotonic() - start < 1.5
    assert info.value.status == "DEADLINE_EXCEEDED"


def test_http_trickling_server_cannot_outlast_the_whole_request_deadline(
    sse_server: tuple[str, Script],
) -> None:
    url, script = sse_server
    # every event comes well within a per-read timeout; only a whole-request deadline stops this
    script.writes = [(0.1, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(60)]
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError):
        list(SpecDecClient(url, protocol="http", timeout_s=0.6).stream("x"))
    assert time.monotonic() - start < 1.5
    # the server sees the connection closed (that cancels the request) long before its 6 s of events end
    assert script.disconnected.wait(1.5)


def test_http_read_timeout_shrinks_to_what_is_left_of_the_deadline(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    # 0.8 s of events, then a stall: the read that waits must give up at the 1 s deadline, not 1 s later
    script.writes = [(0.1, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(8)]
    script.writes.append((5.0, sse(FINAL_EVENT)))
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError):
        list(SpecDecClient(url, protocol="http", timeout_s=1.0).stream("x"))
    assert 0.9 < time.monotonic() - start < 1.4


def test_http_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(SpecDecConnectionError):
            list(SpecDecClient(f"127.0.0.1:{port}", protocol="http", timeout_s=5).stream("x"))


# ---------------------------------------------------------------- gRPC transport against a stand-in client


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


def test_grpc_stream_sets_timeout_final_flag_and_closes_gracefully(fake_grpc: type[FakeGrpcClient]) -> None:
    fake_grpc.script = [
        (_infer_result({"text_output": "Hel", "output_token_count": 1}, final=False), None),
        (_final_result(), None),
    ]
    client = SpecDecClient("example:8001", model="m", timeout_s=7)
    chunks = list(client.stream("Hi", num_draft_tokens=4))
    assert [c.text for c in chunks] == ["Hel", ""] and chunks[-1].stats == STATS
    fake = fake_grpc.instances[0]
    assert fake.url == "example:8001"
    assert fake.call("start_stream")["stream_timeout"] == 7
    # no triton_grpc_error header: tritonserver 2.51 crashed on that path
    assert fake.call("start_stream")["headers"] is None
    infer = fake.call("async_stream_infer")
    assert infer["model_name"] == "m" and infer["enable_empty_final_response"] is True
    assert [i.name() for i in infer["inputs"]] == ["text_input", "num_draft_tokens", "stream"]
    assert fake.call("stop_stream") == {"cancel_requests": False}
    assert fake.calls[-1][0] == "close"


def test_grpc_early_break_cancels_the_request(fake_grpc: type[FakeGrpcClient]) -> None:
    fake_grpc.script = [
        (_infer_result({"text_output": "a", "output_token_count": 1}, final=False), None),
        (_infer_result({"text_output": "b", "output_token_count": 2}, final=False), None),
    ]
    for _chunk in SpecDecClient("h:1", timeout_s=5).stream("x"):
        break
    fake = fake_grpc.instances[0]
    assert fake.call("stop_stream") == {"cancel_requests": True}
    assert fake.calls[-1][0] == "close"


def test_grpc_no_final_response_times_out_and_cancels(fake_grpc: type[FakeGrpcClient]) -> None:
    fake_grpc.script = [(_infer_result({"text_output": "a", "output_token_count": 1}, final=False), None)]
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError):
        list(SpecDecClient("h:1", timeout_s=0.3).stream("x"))
    assert 0.25 < time.monotonic() - start < 1.5
    assert fake_grpc.instances[0].call("stop_stream") == {"cancel_requests": True}


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        (
            InferenceServerException("top_p: must be in (0, 1]", "StatusCode.INVALID_ARGUMENT"),
            InvalidRequestError,
            None,
        ),
        (InferenceServerException("engine exploded", "StatusCode.INTERNAL"), SpecDecError, "INTERNAL"),
        (
            InferenceServerException("failed to connect", "StatusCode.UNAVAILABLE"),
            SpecDecConnectionError,
            None,
        ),
        (
            InferenceServerException("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED"),
            SpecDecTimeoutError,
            None,
        ),
        # without triton_grpc_error Triton sends bare messages: bad input is recognised by its field name
        (InferenceServerException("max_tokens: must be > 0"), InvalidRequestError, None),
        (InferenceServerException("Request for unknown model: 'm'"), SpecDecError, "UNKNOWN"),
    ],
)
def test_grpc_stream_errors_end_the_request_with_a_typed_error(
    fake_grpc: type[FakeGrpcClient], error: InferenceServerException, kind: type, status: str | None
) -> None:
    # the error comes after one chunk and without a final flag: it alone must end the request
    fake_grpc.script = [
        (_infer_result({"text_output": "a", "output_token_count": 1}, final=False), None),
        (None, error),
    ]
    received = []
    with pytest.raises(SpecDecError) as info:
        # resume off: a cut stream (UNAVAILABLE) ends in its error, as before resuming existed
        for chunk in SpecDecClient("h:1", timeout_s=5, resume=False).stream("x"):
            received.append(chunk.text)
    assert received == ["a"]
    assert type(info.value) is kind
    if status is not None:
        assert info.value.status == status
    assert fake_grpc.instances[0].calls[-1][0] == "close"


def test_grpc_empty_final_response_ends_the_stream(fake_grpc: type[FakeGrpcClient]) -> None:
    fake_grpc.script = [
        (_infer_result({"text_output": "a", "output_token_count": 1}, final=False), None),
        (_infer_result({}, final=True), None),
        (_infer_result({"text_output": "never read"}, final=False), None),
    ]
    completion = SpecDecClient("h:1", timeout_s=5).generate("x")
    assert completion == Completion("a", 1, None, None)


# ---------------------------------------------------------------- client construction


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, None, "5", True])
def test_a_timeout_is_always_set(timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SpecDecClient("h:1", timeout_s=timeout)


def test_per_call_timeout_is_checked_too() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SpecDecClient("h:1").stream("x", timeout_s=0)


def test_default_urls_and_bad_urls() -> None:
    assert SpecDecClient().url == "localhost:8001"
    assert SpecDecClient(protocol="http").url == "localhost:8000"
    assert SpecDecClient().timeout_s == 60.0
    assert SpecDecClient("grpc://h:9").url == "h:9"
    with pytest.raises(ValueError, match="url"):
        SpecDecClient("http://h:8001", protocol="grpc")
    with pytest.raises(ValueError, match="protocol"):
        SpecDecClient(protocol="websocket")  # type: ignore[arg-type]


def test_bad_arguments_fail_before_anything_is_sent(fake_grpc: type[FakeGrpcClient]) -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SpecDecClient("h:1").stream("x", max_tokens=-(2**40))
    assert fake_grpc.instances == []


# ---------------------------------------------------------------- CLI


def test_cli_defaults_and_flags() -> None:
    args = cli.parse_args(["generate", "Hello"])
    assert (args.text, args.url, args.protocol, args.stream, args.timeout, args.model) == (
        "Hello",
        None,
        "grpc",
        True,
        60.0,
        "specdec",
    )
    assert args.stop == [] and args.max_tokens is None and not args.json
    args = cli.parse_args(
        [
            "generate",
            "Hi",
            "--no-stream",
            "--protocol",
            "http",
            "--stop",
            "a",
            "--stop",
            "b",
            "--top-p",
            "0.5",
        ]
    )
    assert (args.stream, args.protocol, args.stop, args.top_p) == (False, "http", ["a", "b"], 0.5)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["generate"],
        ["generate", "x", "--protocol", "ws"],
        ["generate", "x", "--timeout", "0"],
        ["generate", "x", "--timeout", "inf"],
        ["generate", "x", "--max-tokens", "many"],
        ["generate", "x", "--retries", "-1"],
    ],
)
def test_cli_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--help"]) == 0
    assert "--num-draft-tokens" in capsys.readouterr().out


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


def test_cli_streams_text_then_summary_on_stderr(fake_client: type[FakeClient]) -> None:
    code, out, err = _run_cli(
        [
            "generate",
            "Capital?",
            "--max-tokens",
            "2",
            "--seed",
            "3",
            "--stop",
            ".",
            "--timeout",
            "9",
            "--cache-salt",
            "t1",
        ]
    )
    assert code == 0
    assert out == "Paris is\n"
    assert err == "[2 tokens, length; drafted 12, accepted 9 (75%), mean accepted length 3.25]\n"
    client = fake_client.made[0]
    assert client.init == {
        "url": None,
        "protocol": "grpc",
        "model": "specdec",
        "timeout_s": 9.0,
        "retries": 3,
        "resume": True,
        "resume_timeout_s": 60.0,
        "routing": "prefix",
        "route_prefix_chars": 1024,
    }
    name, prompt, kwargs = client.calls[0]
    assert (name, prompt) == ("stream", "Capital?")
    assert kwargs["max_tokens"] == 2 and kwargs["seed"] == 3 and kwargs["stop_words"] == ["."]
    assert kwargs["cache_salt"] == "t1"
    assert kwargs["temperature"] is None  # unset flags stay unset: server defaults


def test_cli_no_stream_asks_for_text_without_the_prompt(fake_client: type[FakeClient]) -> None:
    code, out, _ = _run_cli(["generate", "Capital?", "--no-stream", "--protocol", "http"])
    assert code == 0 and out == "Paris is\n"
    name, _, kwargs = fake_client.made[0].calls[0]
    assert name == "generate" and kwargs["exclude_input_in_output"] is True
    assert fake_client.made[0].init["protocol"] == "http"
    _run_cli(["generate", "Capital?", "--retries", "0"])
    assert fake_client.made[1].init["retries"] == 0


def test_cli_json_prints_one_object(fake_client: type[FakeClient]) -> None:
    code, out, err = _run_cli(["generate", "Capital?", "--json"])
    assert code == 0 and err == ""
    assert json.loads(out) == {
        "text": "Paris is",
        "token_count": 2,
        "finish_reason": "length",
        "stats": {
            "draft_tokens": 12,
            "accepted_tokens": 9,
            "verify_rounds": 4,
            "acceptance_rate": 0.75,
            "mean_accepted_length": 3.25,
            "mean_num_draft_tokens": 3.0,
            "resumed": 0,
        },
        "seed": None,
        "model_fingerprint": None,
        "cached_tokens": None,
    }


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequestError("top_p: must be in (0, 1]"), 2),
        (SpecDecTimeoutError("no final response within 60 s"), 3),
        (SpecDecConnectionError("connection refused"), 1),
        (SpecDecError("engine exploded", "INTERNAL"), 1),
    ],
)
def test_cli_errors_map_to_exit_codes(fake_client: type[FakeClient], error: SpecDecError, code: int) -> None:
    fake_client.outcome = error
    got, out, err = _run_cli(["generate", "x"])
    assert got == code
    assert out == "partial\n"  # text so far, line ended
    assert err.startswith("specdec-client: error: ") and error.message in err


def test_cli_client_side_bad_value_exits_2() -> None:
    # a real client: the seed cannot be carried as UINT64, so nothing is sent
    code, _, err = _run_cli(["generate", "x", "--seed", "-1", "--url", "127.0.0.1:9"])
    assert code == 2 and "seed" in err


def test_cli_interrupt_cancels_the_stream(
    fake_client: type[FakeClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted_write(text: str) -> int:
        raise KeyboardInterrupt

    out = io.StringIO()
    monkeypatch.setattr(out, "write", interrupted_write)
    err = io.StringIO()
    assert cli.main(["generate", "x"], stdout=out, stderr=err) == 130
    assert fake_client.made[0].closed_early


def test_cli_over_http_end_to_end(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.writes = [(0, sse({"text_output": "Bonjour", "output_token_count": 1})), (0, sse(FINAL_EVENT))]
    code, out, err = _run_cli(["generate", "Hello", "--protocol", "http", "--url", url, "--top-k", "5"])
    assert (code, out) == (0, "Bonjour\n")
    assert "3 tokens, length" in err
    assert script.requests[0][1] == {"text_input": "Hello", "top_k": 5, "stream": True}


# ---------------------------------------------------------------- retries (the transports stood in for)


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


def test_refusals_for_now_are_retried_within_the_deadline() -> None:
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    assert list(_with_retries(attempts, 30.0, retries=3)) == CHUNKS
    assert len(attempts.given) == 3 and attempts.given[0] == 30.0 and attempts.given[2] < 30.0


def test_retries_run_out_and_the_last_refusal_is_raised() -> None:
    attempts = Attempts(*[make_error(QUEUE_FULL, "UNAVAILABLE") for _ in range(3)])
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 30.0, retries=2))
    assert len(attempts.given) == 3
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 30.0, retries=0))


REFUSED_AT_FIRST_CONTACT = "connection failed: [Errno 111] Connection refused"


def test_a_refused_first_contact_tries_the_other_replicas_before_pausing() -> None:
    """Several replicas: a request one cannot take (connection refused, restarting, overloaded) goes
    to the next at once; only once every replica failed does it pause, for ``retries`` rounds."""
    attempts = Attempts(SpecDecConnectionError(REFUSED_AT_FIRST_CONTACT), CHUNKS)
    landed = [1]
    start = time.monotonic()
    assert list(_with_retries(attempts, 30.0, 0, order=[1, 0], landed=landed)) == CHUNKS
    assert attempts.replicas == [1, 0] and landed == [0] and time.monotonic() - start < 0.2
    refused = [SpecDecConnectionError(REFUSED_AT_FIRST_CONTACT) for _ in range(6)]
    attempts = Attempts(*refused)
    start = time.monotonic()
    with pytest.raises(SpecDecConnectionError, match="Connection refused"):
        list(_with_retries(attempts, 30.0, 1, order=[0, 1, 2]))
    # two rounds of three, one pause (0.125-0.25 s) between them
    assert attempts.replicas == [0, 1, 2, 0, 1, 2] and 0.1 < time.monotonic() - start < 0.5
    attempts = Attempts(make_error("top_p: must be in (0, 1]", "INVALID_ARGUMENT"), CHUNKS)
    with pytest.raises(InvalidRequestError):  # bad input is bad on every replica
        list(_with_retries(attempts, 30.0, 3, order=[0, 1]))
    assert attempts.replicas == [0]


def test_no_retry_past_the_deadline_for_bad_input_or_once_text_arrived() -> None:
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 0.05, retries=3))  # the first pause would pass the deadline
    attempts = Attempts(make_error("top_p: must be in (0, 1]", "INVALID_ARGUMENT"), CHUNKS)
    with pytest.raises(InvalidRequestError):
        list(_with_retries(attempts, 30.0, retries=3))
    received = []
    attempts = Attempts([StreamChunk("a", 1)], CHUNKS)
    stream = _with_retries(attempts, 30.0, retries=3)
    received.append(next(stream))
    stream.close()  # leaving early closes the attempt (cancels the request), and sends nothing again
    assert received == [StreamChunk("a", 1)] and attempts.closed == 1 and len(attempts.given) == 1


# ---------------------------------------------------------------- resuming a cut stream (no server)


def text_digest_of(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_a_cut_stream_is_sent_again_with_its_seed_and_the_tokens_to_skip() -> None:
    from trispec_client.resume import StreamResume, text_digest

    state = StreamResume(GenerationRequest("Hi", max_tokens=8, temperature=0.8))
    assert state.request().skip_output_tokens is None and not state.started
    state.take(StreamChunk("Bon", 2, seed=77))
    state.take(StreamChunk("jour", 3))
    state.cut(SpecDecConnectionError("Stream removed"))
    again = state.request()
    assert (again.seed, again.skip_output_tokens, again.temperature) == (77, 3, 0.8)
    # the resumed stream confirms the skipped text, then carries on; the final chunk says resumed: 1
    state.take(StreamChunk(" à", 5, skipped_text_sha256=text_digest("Bonjour")))
    final = state.take(StreamChunk("", 5, final=True, finish_reason="length", stats=STATS))
    assert final.stats is not None and final.stats.resumed == 1 and state.text == "Bonjour à"


@pytest.mark.parametrize(
    "first",
    [
        StreamChunk(" à", 5, skipped_text_sha256=text_digest_of("Bonsoir")),  # other text
        StreamChunk(" à", 5),  # no confirmation at all
        StreamChunk(" à", 5, seed=78, skipped_text_sha256=text_digest_of("Bonjour")),  # other seed
        StreamChunk(" à", 2, skipped_text_sha256=text_digest_of("Bonjour")),  # fewer tokens
    ],
)
def test_a_resumed_stream_that_differs_is_never_spliced(first: StreamChunk) -> None:
    from trispec_client.errors import SpecDecResumeError
    from trispec_client.resume import StreamResume

    state = StreamResume(GenerationRequest("Hi", temperature=0.8))
    state.take(StreamChunk("Bonjour", 3, seed=77))
    state.cut(SpecDecConnectionError("Stream removed"))
    with pytest.raises(SpecDecResumeError):
        state.take(first)
    assert state.text == "Bonjour"


REFUSED = "failed to connect to all addresses; Connection refused"


@pytest.mark.parametrize(
    ("error", "started", "reached", "cut"),
    [
        (SpecDecConnectionError("Stream removed (Socket closed)"), False, False, True),
        (SpecDecError("Stub process 'specdec_0_0' is not healthy."), False, False, True),
        (
            SpecDecConnectionError("connection failed: ('Connection broken: IncompleteRead(0 bytes read)')"),
            True,
            True,
            True,
        ),
        (SpecDecConnectionError(REFUSED), True, True, True),
        # a server this client had answers from is restarting; an address never reached is not waited for
        (SpecDecConnectionError(REFUSED), False, True, True),
        (SpecDecConnectionError(REFUSED), False, False, False),
        # a refusal for now of a new request is retried and raised as ever, not waited for
        (make_error(QUEUE_FULL, "UNAVAILABLE"), False, True, False),
        (make_error(QUEUE_FULL, "UNAVAILABLE"), True, True, True),  # a resume meeting a busy server
        (InvalidRequestError("top_p: must be in (0, 1]"), True, True, False),
        (SpecDecTimeoutError("no final response within 1 s"), True, True, False),
        (SpecDecError("generation failed: boom", "INTERNAL"), True, True, False),
    ],
)
def test_which_failures_are_resumed(error: SpecDecError, started: bool, reached: bool, cut: bool) -> None:
    from trispec_client.resume import is_cut

    assert is_cut(error, started=started, reached=reached) is cut


def test_cli_resumes_by_default_and_no_resume_turns_it_off(fake_client: type[FakeClient]) -> None:
    _run_cli(["generate", "Capital?"])
    _run_cli(["generate", "Capital?", "--no-resume", "--resume-timeout", "5"])
    assert [(c.init["resume"], c.init["resume_timeout_s"]) for c in fake_client.made] == [
        (True, 60.0),
        (False, 5.0),
    ]
    assert cli.main(["generate", "x", "--resume-timeout", "0"]) == 2


def test_waiting_for_a_server_to_come_back_is_bounded() -> None:
    from trispec_client.resume import pauses, wait_until_ready

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: every readiness probe is refused
        port = sock.getsockname()[1]
        for protocol in ("http", "grpc"):
            client = SpecDecClient(f"127.0.0.1:{port}", protocol=protocol)  # type: ignore[arg-type]
            start = time.monotonic()
            with pytest.raises(SpecDecConnectionError, match=r"not ready again within 1\.5 s"):
                wait_until_ready(
                    client._model_ready, start, 1.5, pauses(), SpecDecConnectionError("Stream removed")
                )
            assert 1.0 < time.monotonic() - start < 2.5


# ---------------------------------------------------------------- several replicas (no server)


def test_a_resumed_stream_must_come_from_the_model_it_began_on() -> None:
    from trispec_client.resume import StreamResume, is_other_model, text_digest

    state = StreamResume(GenerationRequest("Hi", max_tokens=8))
    state.take(StreamChunk("Bon", 2, model_fingerprint="aaaa"))
    state.cut(SpecDecConnectionError("Stream removed"))
    assert state.request().expected_model_fingerprint == "aaaa"  # the replica checks it first
    assert state.request().sent_values()["expected_model_fingerprint"] == "aaaa"
    # a replica that answers anyway with another model's text is not continued
    with pytest.raises(SpecDecResumeError, match="serving model fingerprint bbbb, not aaaa"):
        state.take(StreamChunk("jour", 3, skipped_text_sha256=text_digest("Bon"), model_fingerprint="bbbb"))
    assert state.text == "Bon"
    message = "expected_model_fingerprint: this replica serves model fingerprint bbbb, not aaaa"
    refusal = make_error(message, status_from_message(message))  # as both transports classify it
    assert isinstance(refusal, InvalidRequestError) and is_other_model(refusal)
    assert not is_other_model(SpecDecConnectionError("Stream removed"))
    # a stream from a server without fingerprints is resumed as before, checked by its digest alone
    old = StreamResume(GenerationRequest("Hi"))
    old.take(StreamChunk("Bon", 2))
    old.cut(SpecDecConnectionError("Stream removed"))
    assert "expected_model_fingerprint" not in old.request().sent_values()


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


def test_a_stream_cut_on_one_replica_resumes_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    from trispec_client.resume import text_digest

    client = SpecDecClient("a:1,b:2", timeout_s=30, resume_timeout_s=5, routing="round-robin")
    assert client.urls == ["a:1", "b:2"]
    cut = SpecDecConnectionError("Stream removed")
    fleet = Fleet(
        client,
        monkeypatch,
        r0=[[StreamChunk("Bon", 2, seed=7, model_fingerprint="aaaa"), cut]],
        r1=[
            [
                StreamChunk("jour", 4, skipped_text_sha256=text_digest("Bon"), model_fingerprint="aaaa"),
                StreamChunk("", 4, final=True, finish_reason="length", stats=STATS),
            ]
        ],
    )
    fleet.ready[0] = False  # the replica that cut the stream is gone
    chunks = list(client.stream("Hi", temperature=0.8))
    assert "".join(c.text for c in chunks) == "Bonjour" and chunks[-1].stats.resumed == 1
    (first, _), (second, again) = fleet.sent
    assert (first, second) == (0, 1)
    assert (again.seed, again.skip_output_tokens, again.expected_model_fingerprint) == (7, 2, "aaaa")


def test_a_replica_serving_another_model_never_continues_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other replica refuses (another fingerprint): with no other ready replica serving the model
    the stream began on, the request ends in SpecDecResumeError after the text before the cut."""
    client = SpecDecClient(["a:1", "b:2", "c:3"], timeout_s=30, resume_timeout_s=5, routing="round-robin")
    message = "expected_model_fingerprint: this replica serves model fingerprint bbbb, not aaaa"
    other = make_error(message, status_from_message(message))
    fleet = Fleet(
        client,
        monkeypatch,
        r0=[[StreamChunk("Bon", 2, model_fingerprint="aaaa"), SpecDecConnectionError("Stream removed")]],
        r1=[other],
        r2=[other],
    )
    fleet.ready[0] = False
    delivered = []
    with pytest.raises(SpecDecResumeError, match="serves model fingerprint bbbb, not aaaa"):
        for chunk in client.stream("Hi"):
            delivered.append(chunk.text)
    assert delivered == ["Bon"] and [i for i, _ in fleet.sent] == [0, 1, 2]


# ---------------------------------------------------------------- routing (no server)
def test_requests_that_begin_alike_go_to_the_same_replica_and_fail_over_in_one_order() -> None:
    from trispec_client.routing import Router

    urls = ["a:1", "b:2", "c:3"]
    router = Router(urls)
    system = "You are a helpful assistant. " * 40  # 1,160 characters: past the 1,024 that place it
    turns = [system + "Hi", system + "Hi\nHello! How can I help?\nTell me a joke."]
    orders = [router.order(t) for t in turns]
    assert orders[0] == orders[1] and sorted(orders[0]) == [0, 1, 2]  # every replica, once
    assert Router(urls).order(turns[0]) == orders[0]  # any client places it alike: no shared state
    assert (
        router.order(turns[0], cache_salt="tenant-b") != orders[0]
        or router.order(turns[0], cache_salt="tenant-c") != orders[0]
    )  # the salt takes part
    # different conversations spread over the replicas; dropping one moves only its own requests
    prompts = [f"conversation {i}: " + "x" * 30 for i in range(600)]
    homes = [router.order(p)[0] for p in prompts]
    assert all(homes.count(r) > 150 for r in range(3))
    fewer = Router(["a:1", "c:3"])
    for prompt, home in zip(prompts, homes):
        if home != 1:
            assert ["a:1", "c:3"][fewer.order(prompt)[0]] == urls[home]
    # round-robin: in turn, whatever the text
    rr = Router(urls, "round-robin")
    assert [rr.order(turns[0])[0] for _ in range(4)] == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="routing"):
        Router(urls, "random")  # type: ignore[arg-type]


def test_a_client_sends_a_conversations_turns_to_one_replica_and_its_salt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = SpecDecClient(["a:1", "b:2", "c:3", "d:4"], timeout_s=30)
    final = StreamChunk("", 1, final=True, finish_reason="length", stats=STATS, cached_tokens=12)
    fleet = Fleet(client, monkeypatch, **{f"r{i}": [[final]] * 4 for i in range(4)})
    history = "Some long shared context. " * 50
    for turn in ("one", "two", "three"):
        history += turn
        assert client.generate(history, cache_salt="s3cret").cached_tokens == 12
    places = {index for index, _ in fleet.sent}
    assert len(places) == 1 and all(r.cache_salt == "s3cret" for _, r in fleet.sent)
    assert fleet.sent[0][1].sent_values()["cache_salt"] == "s3cret"
    with pytest.raises(InvalidRequestError, match="cache_salt"):
        client.generate("x", cache_salt="")


def test_cli_summary_says_the_cached_prompt_tokens() -> None:
    completion = Completion("x", 2, "length", None, cached_tokens=48)
    assert cli.summary(completion) == "[2 tokens, length, 48 prompt tokens cached]"
    assert cli.summary(Completion("x", 2, "length", None, cached_tokens=0)) == "[2 tokens, length]"
