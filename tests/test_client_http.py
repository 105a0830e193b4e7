"""trispec_client's HTTP transport against a small scripted SSE server on a local port (real sockets,
real urllib3, ``client_stand_ins.sse_server``): chunks, errors mid-stream, closing, timeouts and
the whole-request deadline. The timeouts are real waits on real sockets, so each test's script makes
a broken client take seconds longer than a working one (a stall or a trickle far past the deadline)
and its time bound sits between the two: never a sub-second window on a loaded machine.
"""

from __future__ import annotations

import socket
import time

import pytest
from client_stand_ins import FINAL_EVENT, STATS, Script, sse
from trispec_client import (
    Completion,
    InvalidRequestError,
    SpecDecClient,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecTimeoutError,
    StreamChunk,
)


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
    # 200 events 50 ms apart: only a closed connection makes the server's writes fail (a client that
    # keeps it open sees them all succeed, for 10 s)
    script.writes = [(0.05, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(200)]
    for _chunk in SpecDecClient(url, protocol="http", timeout_s=30).stream("x"):
        break
    assert script.disconnected.wait(8.0)


def test_http_stalled_server_times_out(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    # a 0.4 s timeout against a 10 s stall: without one the client waits the stall out (and succeeds)
    script.writes = [(0, sse({"text_output": "a", "output_token_count": 1})), (10.0, sse(FINAL_EVENT))]
    received = []
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError) as info:
        received.extend(c.text for c in SpecDecClient(url, protocol="http", timeout_s=0.4).stream("x"))
    assert time.monotonic() - start < 5.0
    assert received == ["a"] and info.value.status == "DEADLINE_EXCEEDED"


def test_http_trickling_server_cannot_outlast_the_whole_request_deadline(
    sse_server: tuple[str, Script],
) -> None:
    url, script = sse_server
    # every event comes well within a per-read timeout; only a whole-request deadline stops this
    # (10 s of events, one per 50 ms: a client without one reads them all, and succeeds)
    script.writes = [(0.05, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(200)]
    received = []
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError):
        received.extend(SpecDecClient(url, protocol="http", timeout_s=0.6).stream("x"))
    assert time.monotonic() - start < 5.0 and len(received) < 100  # stopped in the first half
    # the server sees the connection closed (that cancels the request) before its events end
    assert script.disconnected.wait(8.0)


def test_http_read_timeout_shrinks_to_what_is_left_of_the_deadline(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    # 2.8 s of events, then a stall: the read that waits must give up at the 3 s deadline (a read
    # timeout of the whole 3 s, not shrunk, would give up at 5.8 s at the earliest)
    script.writes = [(0.1, sse({"text_output": "t", "output_token_count": i + 1})) for i in range(28)]
    script.writes.append((30.0, sse(FINAL_EVENT)))
    start = time.monotonic()
    with pytest.raises(SpecDecTimeoutError):
        list(SpecDecClient(url, protocol="http", timeout_s=3.0).stream("x"))
    assert 2.9 < time.monotonic() - start < 5.0


def test_http_nothing_listening_is_a_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(SpecDecConnectionError):
            list(SpecDecClient(f"127.0.0.1:{port}", protocol="http", timeout_s=5).stream("x"))
