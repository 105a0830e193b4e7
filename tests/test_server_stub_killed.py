"""End to end against the shared real server (``e2e_server``): killing the Python stub errors its
clients within their timeout and the supervisor brings the server back (a new request succeeds).
The file sorts after the other ``test_server_*.py`` files that share the server, so on one worker
it runs after them; it leaves the server ready.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from e2e_server import PROMPTS, StreamResult, grpc_stream, reference
from served import Server

pytestmark = [pytest.mark.server, pytest.mark.real_model]


@pytest.fixture(scope="module")
def server(e2e_server: Server) -> Server:
    """The real server the test_server_*.py files share (``e2e_server``)."""
    return e2e_server


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
