"""trispec_client's gRPC transport against a stand-in for tritonclient's InferenceServerClient fed real
InferResults (``client_stand_ins.fake_grpc``): timeouts, the final flag, cancelling, typed errors;
and the client's construction (timeouts always set, URLs, bad arguments).
"""

from __future__ import annotations

import math
import queue
from types import SimpleNamespace
from typing import Any

import pytest
from client_stand_ins import STATS, FakeGrpcClient, _final_result, _infer_result
from trispec_client import (
    Completion,
    InvalidRequestError,
    SpecDecClient,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecTimeoutError,
    grpc_transport,
)
from tritonclient.utils import InferenceServerException
from virtual_clock import VirtualClock, VirtualQueue


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


def test_grpc_no_final_response_times_out_and_cancels(
    fake_grpc: type[FakeGrpcClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for the next response is what is left of the deadline, read off a virtual clock (the
    transport's waits on its response queue take their timeout at once), not timed."""
    clock = VirtualClock()
    monkeypatch.setattr(grpc_transport, "time", clock)
    monkeypatch.setattr(
        grpc_transport, "queue", SimpleNamespace(Queue=lambda: VirtualQueue(clock), Empty=queue.Empty)
    )
    fake_grpc.script = [(_infer_result({"text_output": "a", "output_token_count": 1}, final=False), None)]
    start = clock.monotonic()
    with pytest.raises(SpecDecTimeoutError, match=r"within 0\.3 s"):
        list(SpecDecClient("h:1", timeout_s=0.3).stream("x"))
    assert len(clock.pauses) == 1 and clock.pauses[0] <= 0.3  # one wait, never past the deadline
    assert clock.monotonic() - start >= 0.3  # nor given up before it
    assert fake_grpc.instances[0].call("start_stream")["stream_timeout"] == 0.3  # the server's deadline
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
