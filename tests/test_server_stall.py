"""A stalled Python stub is waited for, not restarted: ``specdec-serve`` with the default model, the
stub stopped (SIGSTOP) for 5 s while streams are in flight and new requests arrive, then continued.

Without the supervisor keeping the stub's health flag (see ``StubHealthFlag``), Triton 2.51 fails the
request it is handing to the stopped stub after about a second, the stub crashes when continued,
and the supervisor has to restart the server: every stream below would end in an error.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_server import StreamResult, grpc_stream
from served import Server, start_server, stop_server, wait_for
from trispec.serving.tritonserver import StubProcess, find_stubs

pytestmark = [pytest.mark.server, pytest.mark.real_model]

STALL_S = 5.0
# in flight when the stub stops: long enough (about 3 s alone here) to still be running then
IN_FLIGHT = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
# sent while the stub is stopped
ARRIVING = ["Water boils at", "The three primary colours are"]
# greedy (the default config), and ended by max_tokens only: an end_id SmolLM2 never emits here
LONG = {"max_tokens": 128, "end_id": 49151, "stream": True, "num_draft_tokens": 4}
SHORT = {**LONG, "max_tokens": 32}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("stall")
    # the launcher's own lines; tritonserver's go to server.log
    srv = start_server(
        tmp, "--open-admin-apis", "--log-file", str(tmp / "server.log"), log_name="launcher.log"
    )
    yield srv
    stop_server(srv)


def tritonserver_pid(launcher_pid: int) -> int:
    pids = [
        int(line)
        for line in Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
        if Path(f"/proc/{line}/comm").read_text().strip() == "tritonserver"
    ]
    assert len(pids) == 1, pids
    return pids[0]


def test_a_stub_stopped_for_5_s_is_waited_for_and_every_stream_finishes_exact(server: Server) -> None:
    # what each prompt gets before any stall: all at once (greedy: a text does not depend on what
    # shares the batch, test_batch_invariance.py), in the time of one
    before: dict[str, StreamResult] = {}
    requests = [(p, LONG) for p in IN_FLIGHT] + [(p, SHORT) for p in ARRIVING]
    runs = [
        threading.Thread(target=lambda p=p, v=v: before.__setitem__(p, grpc_stream(server, p, **v)))
        for p, v in requests
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join(150)
    for prompt, _ in requests:
        got = before.get(prompt)
        assert got is not None and got.error is None and got.final["finish_reason"] == b"length", got
    alone = {prompt: got.text for prompt, got in before.items()}
    server_pid = tritonserver_pid(server.process.pid)
    stubs = find_stubs(server.process.pid)
    assert [s.instance for s in stubs] == ["specdec_0_0"]
    stub: StubProcess = stubs[0]
    # the serving loop's heartbeat, where the launcher told the stubs to keep it, moves while idle
    environ = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
    beats = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"SPECDEC_HEARTBEAT_DIR="))
    heartbeat = Path(beats) / "specdec_0_0"
    first_beat = heartbeat.stat().st_mtime_ns
    wait_for(lambda: heartbeat.stat().st_mtime_ns > first_beat, 10, "the loop's heartbeat to move")

    results: dict[str, StreamResult | BaseException] = {}

    def stream(prompt: str, started: threading.Event | None, values: dict[str, object]) -> None:
        try:
            results[prompt] = grpc_stream(server, prompt, timeout_s=120, started=started, **values)
        except BaseException as exc:  # a timeout fails the assertions below, not the thread
            results[prompt] = exc

    threads = []
    for prompt in IN_FLIGHT:
        started = threading.Event()
        threads.append(threading.Thread(target=stream, args=(prompt, started, LONG)))
        threads[-1].start()
        assert started.wait(60), f"{prompt!r} never started"
    os.kill(stub.pid, signal.SIGSTOP)
    try:
        assert not results, f"finished before the stall, so not in flight: {list(results)}"
        for prompt in ARRIVING:  # Triton hands these to the stopped stub
            threads.append(threading.Thread(target=stream, args=(prompt, None, SHORT)))
            threads[-1].start()
        time.sleep(STALL_S)
        assert stub.is_stopped()
    finally:
        os.kill(stub.pid, signal.SIGCONT)
    for thread in threads:
        thread.join(150)

    for prompt in IN_FLIGHT + ARRIVING:
        got = results.get(prompt)
        assert isinstance(got, StreamResult), f"{prompt!r}: {got!r}"
        assert got.error is None, f"{prompt!r}: {got.error}"
        assert got.final.get("finish_reason") == b"length", prompt
        assert got.text == alone[prompt], prompt

    # nothing restarted: the same server and stub, the supervisor never said a word
    assert stub.is_alive() and not stub.is_stopped()
    assert tritonserver_pid(server.process.pid) == server_pid
    assert find_stubs(server.process.pid) == [stub]
    launcher_log = server.log.read_text()
    assert "restarting tritonserver" not in launcher_log and "ready again" not in launcher_log, launcher_log
    resumed_beat = heartbeat.stat().st_mtime_ns
    wait_for(lambda: heartbeat.stat().st_mtime_ns > resumed_beat, 10, "the loop's heartbeat to move again")
