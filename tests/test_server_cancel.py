"""End to end against the shared real server (``e2e_server``): a stream cancelled mid-way leaves the
batch and frees its KV blocks while another completes correctly; an HTTP client that disconnects
cancels its request.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from e2e_server import PROMPTS, StreamResult, grpc_stream, reference, wait_until_no_kv_block_is_used
from served import Server

pytestmark = [pytest.mark.server, pytest.mark.real_model]


@pytest.fixture(scope="module")
def server(e2e_server: Server) -> Server:
    """The real server the test_server_*.py files share (``e2e_server``)."""
    return e2e_server


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
