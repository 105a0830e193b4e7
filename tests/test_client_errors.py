"""trispec_client without Triton: SSE parsing (events split anywhere, cut off by the end) and the typed
errors the server's replies become (refusals for now are retryable; HTTP statuses).
"""

from __future__ import annotations

import json

import pytest
from client_stand_ins import FINAL_EVENT, QUEUE_FULL, QUEUE_TIMEOUT, STATS
from trispec_client import (
    InvalidRequestError,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecOverloadedError,
    StreamChunk,
)
from trispec_client.errors import make_error, status_from_message
from trispec_client.http_transport import error_from_response, event_to_chunk
from trispec_client.sse import SSEParser


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
