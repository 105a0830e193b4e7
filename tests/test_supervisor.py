"""specdec-serve's supervisor over the real tritonserver with the tiny test models: a stub stopped while
a request arrives is waited for, a loop whose heartbeat stands still is restarted (but not while
stopped), and the server is restarted after the stub or the server dies or hangs.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
from served import wait_for
from tiny_triton import _collect, _open_stream, _stream_request, supervise
from trispec.serving.supervisor import Supervisor, SupervisorPolicy
from trispec.serving.tritonserver import (
    ServerOptions,
)


@pytest.mark.server
@pytest.mark.parametrize("keep_health", [True, False], ids=["health-flag-kept", "without-health-flag"])
def test_a_stub_stopped_while_a_request_arrives_is_waited_for(
    options: ServerOptions, keep_health: bool
) -> None:
    """The stub is stopped (SIGSTOP) for 4 s while a stream is open and a new request arrives. With
    the supervisor keeping its health flag, both finish whole and nothing restarts. Without (as
    Triton 2.51 alone does), Triton fails the new request after about a second ("not healthy") and
    the stub crashes once continued: the supervisor has to restart, cutting every stream."""
    policy = SupervisorPolicy(ready_timeout_s=60, stub_health_interval_s=0.2 if keep_health else 0.0)
    with supervise(options, policy) as supervisor:
        server = supervisor.server
        assert server is not None
        stub = next(s for s in server.stubs() if s.instance == "stream_0_0")
        old_client, old = _open_stream(options.grpc_port)
        new_client, new = _open_stream(options.grpc_port)
        try:
            _stream_request(old_client, count=40, delay_s=0.05)
            result, error = old.get(timeout=10)
            assert error is None and result.as_numpy("INDEX")[0] == 0
            os.kill(stub.pid, signal.SIGSTOP)
            try:
                _stream_request(new_client, count=3, delay_s=0.0)  # Triton hands it to the stopped stub
                time.sleep(4)
            finally:
                os.kill(stub.pid, signal.SIGCONT)
            new_indices, new_error = _collect(new, 20)
            old_indices, old_error = _collect(old, 20)
        finally:
            for client in (old_client, new_client):
                client.stop_stream(cancel_requests=True)
                client.close()
        if keep_health:
            assert new_error is None and new_indices == [0, 1, 2], new_error
            assert old_error is None and old_indices == list(range(1, 40)), old_error
            time.sleep(1.5)  # a restart would be decided within a poll or two
            assert supervisor.restarts == 0 and supervisor.server is server
            assert stub.is_alive() and server.poll() is None
        else:
            assert new_error is not None and "is not healthy" in str(new_error), new_error
            wait_for(lambda: supervisor.restarts == 1, 30, "the restart after the stub crashed")
            assert not stub.is_alive()


@pytest.mark.server
def test_a_loop_whose_heartbeat_stands_still_is_restarted_but_not_while_stopped(
    options: ServerOptions, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``stream`` model has no serving loop; the test gives its stub a heartbeat file that never
    moves, as a stuck loop's would. While the stub is stopped, twice the threshold passes and nothing
    happens; once it runs again, the supervisor restarts the server within about the threshold."""
    policy = SupervisorPolicy(ready_timeout_s=60, loop_stall_s=2.0)
    with (
        caplog.at_level(logging.WARNING, logger="trispec.serving.supervisor"),
        supervise(options, policy) as sup,
    ):
        first = sup.server
        assert first is not None and first.heartbeat_dir is not None
        stub = next(s for s in first.stubs() if s.instance == "stream_0_0")
        os.kill(stub.pid, signal.SIGSTOP)
        try:
            (first.heartbeat_dir / "stream_0_0").touch()
            time.sleep(4)
            assert sup.restarts == 0, "restarted for a loop that was only stopped"
        finally:
            os.kill(stub.pid, signal.SIGCONT)
        took = wait_for(lambda: sup.restarts == 1, 20, "the restart for the stuck loop")
        assert took >= 1.0, "restarted before the loop had run the threshold"
        assert "the serving loop of stream_0_0" in caplog.text
        wait_for(sup.ready.is_set, 60, "the server to be ready again")
        # the new server's stubs have no heartbeat: nothing to watch, nothing restarts
        time.sleep(3)
        assert sup.restarts == 1


@pytest.mark.server
def test_supervisor_restarts_after_the_stub_or_the_server_dies_or_hangs(
    supervised: Supervisor, options: ServerOptions
) -> None:
    first = supervised.server
    assert first is not None
    stream_stub = next(s for s in first.stubs() if s.instance == "stream_0_0")

    # a long stream is open when its stub is killed: the client must get an error, not hang
    client, responses = _open_stream(options.grpc_port)
    try:
        _stream_request(client, count=200, delay_s=0.05)
        result, error = responses.get(timeout=10)
        assert error is None and result.as_numpy("INDEX")[0] == 0
        os.kill(stream_stub.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while True:
            result, error = responses.get(timeout=20)
            if error is not None:
                break
            assert not result.get_response().parameters["triton_final_response"].bool_param, (
                "the stream finished normally although its stub was killed"
            )
        assert time.monotonic() - killed_at < 15
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()

    restart_s = wait_for(
        lambda: supervised.restarts == 1 and supervised.ready.is_set(), 30, "the server to be ready again"
    )
    second = supervised.server
    assert second is not first and second is not None and first.poll() is not None
    assert all(s.pid != stream_stub.pid for s in second.stubs())
    print(f"stub killed → ready again in {restart_s:.1f} s")

    # a new request on a new connection succeeds, to the end
    client, responses = _open_stream(options.grpc_port)
    try:
        _stream_request(client, count=3, delay_s=0.0)
        indices = []
        while True:
            result, error = responses.get(timeout=20)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            indices.append(int(result.as_numpy("INDEX")[0]))
        assert indices == [0, 1, 2]
    finally:
        client.stop_stream()
        client.close()

    # the server process itself dying is caught too
    assert second.pid is not None
    os.kill(second.pid, signal.SIGKILL)
    restart_s = wait_for(
        lambda: supervised.restarts == 2 and supervised.ready.is_set(), 30, "the second restart"
    )
    print(f"server killed → ready again in {restart_s:.1f} s")

    # a hung server (alive, stubs alive, but not answering) is caught by the readiness probe
    third = supervised.server
    assert third is not None and third.pid is not None
    os.kill(third.pid, signal.SIGSTOP)
    restart_s = wait_for(
        lambda: supervised.restarts == 3 and supervised.ready.is_set(), 30, "the third restart"
    )
    assert third.poll() == -signal.SIGKILL
    print(f"server hung → ready again in {restart_s:.1f} s")
