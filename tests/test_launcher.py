"""specdec-serve: the tritonserver process, its supervisor, and the CLI.

Tests marked ``server`` start the real tritonserver from the nvidia-pytriton wheel with the tiny
Python-backend models in ``tests/triton_models`` (``echo``: one response; ``stream``: decoupled,
COUNT responses DELAY_S apart). Every server gets free ephemeral ports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from served import free_ports, wait_for
from trispec.serving import launcher
from trispec.serving.supervisor import LoopWatch, Supervisor, SupervisorPolicy, retry_delay_s
from trispec.serving.tritonserver import (
    SERVER_ROOT_ENV,
    SHM_DIR,
    SHM_PREFIX_ROOT,
    ServerOptions,
    StubHealthFlag,
    StubProcess,
    TritonInstallation,
    TritonServer,
    TritonServerError,
    build_command,
    find_stubs,
    prepare_backend_directory,
    probe_host,
    process_start_time,
    remove_stale_shm,
    server_environment,
    shm_prefix,
)

MODELS = Path(__file__).parent / "triton_models"


def shm_files(prefix: str) -> list[Path]:
    return sorted(SHM_DIR.glob(f"{prefix}*"))


@pytest.fixture(scope="module")
def install() -> TritonInstallation:
    return TritonInstallation.locate()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    # a copy: the stubs may write __pycache__ beside model.py
    return Path(shutil.copytree(MODELS, tmp_path / "repo"))


@pytest.fixture
def options(repo: Path, tmp_path: Path) -> ServerOptions:
    http, grpc, metrics = free_ports()
    return ServerOptions(
        model_repository=repo,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        # the default: with less, a busy machine may not unload in time and Triton exits with 1
        exit_timeout_s=5,
        log_file=tmp_path / "server.log",
    )


# --- units: no server -------------------------------------------------------------------------------


def test_locate_finds_the_bundled_server_and_the_stub_for_this_python(install: TritonInstallation) -> None:
    assert os.access(install.binary, os.X_OK)
    assert install.stub.parent.name == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert (install.python_backend / "triton_python_backend_utils.py").is_file()
    assert install.libs.is_dir()


def test_backend_directory_links_backend_and_stub(install: TritonInstallation, tmp_path: Path) -> None:
    backend_dir = prepare_backend_directory(tmp_path / "backends", install)
    prepare_backend_directory(backend_dir, install)  # again: replaces its own links
    python_dir = backend_dir / "python"
    names = sorted(p.name for p in python_dir.iterdir())
    assert names == ["libtriton_python.so", "triton_python_backend_stub", "triton_python_backend_utils.py"]
    assert (python_dir / "triton_python_backend_stub").resolve() == install.stub.resolve()
    assert (python_dir / "libtriton_python.so").resolve() == (
        install.python_backend / "libtriton_python.so"
    ).resolve()


def test_environment_puts_libpython_and_the_venv_first(install: TritonInstallation) -> None:
    env = server_environment(install, {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "KEEP": "1"})
    lib_dirs = env["LD_LIBRARY_PATH"].split(os.pathsep)
    assert lib_dirs == [sysconfig.get_config_var("LIBDIR"), str(install.libs), "/opt/lib"]
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]
    assert env["KEEP"] == "1"
    assert "LD_LIBRARY_PATH" in server_environment(install, {"PATH": "/bin"})


def test_command_uses_only_flags_this_tritonserver_knows(install: TritonInstallation, tmp_path: Path) -> None:
    options = ServerOptions(tmp_path, http_port=1, grpc_port=2, metrics_port=3, host="0.0.0.0")
    command = build_command(install, options, tmp_path / "backends", "trispec_1_0_")
    assert "--http-address=0.0.0.0" in command and "--grpc-address=0.0.0.0" in command
    assert "--backend-config=python,shm-region-prefix-name=trispec_1_0_" in command
    assert "--disable-auto-complete-config" in command
    help_text = subprocess.run(
        [str(install.binary), "--help"],
        env=server_environment(install),
        capture_output=True,
        text=True,
        timeout=30,
    )
    known = help_text.stdout + help_text.stderr
    for flag in command[1:]:
        name = flag.split("=", 1)[0]
        assert re.search(rf"^\s+{re.escape(name)}\s", known, re.M), f"{name}: not a tritonserver option"


def test_shm_prefixes_are_unique_and_stale_ones_are_removed() -> None:
    assert shm_prefix() != shm_prefix()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = SHM_DIR / f"{SHM_PREFIX_ROOT}{dead.pid}_0_test"
    mine = SHM_DIR / f"{shm_prefix()}test"
    stale.write_bytes(b"x")
    mine.write_bytes(b"x")
    try:
        removed = remove_stale_shm()
        assert stale in removed and not stale.exists()
        assert mine.exists()  # this process is alive: its files stay
    finally:
        stale.unlink(missing_ok=True)
        mine.unlink(missing_ok=True)


def test_probe_host() -> None:
    assert probe_host("0.0.0.0") == "127.0.0.1"
    assert probe_host("::") == "[::1]"
    assert probe_host("10.0.0.5") == "10.0.0.5"


def test_a_killed_unreaped_process_is_not_alive() -> None:
    # Triton does not reap a crashed stub: it stays a zombie, which must count as dead
    child = subprocess.Popen(["sleep", "30"])
    start_time = process_start_time(child.pid)
    assert start_time is not None
    stub = StubProcess(pid=child.pid, instance="x_0_0", start_time=start_time)
    try:
        assert stub.is_alive()
        assert not StubProcess(child.pid, "x_0_0", start_time + 1).is_alive()  # a reused pid
        os.kill(child.pid, signal.SIGKILL)
        wait_for(lambda: not stub.is_alive(), 5, "the killed process to count as dead")
        assert Path(f"/proc/{child.pid}").exists()  # still there, as a zombie
    finally:
        child.kill()
        child.wait()


def test_retries_back_off_after_the_first() -> None:
    policy = SupervisorPolicy(backoff_initial_s=1.0, backoff_max_s=5.0)
    assert [retry_delay_s(policy, n) for n in range(7)] == [0, 0, 1, 2, 4, 5, 5]


def test_a_stopped_process_is_alive_and_stopped() -> None:
    child = subprocess.Popen(["sleep", "30"])
    start_time = process_start_time(child.pid)
    assert start_time is not None
    stub = StubProcess(pid=child.pid, instance="x_0_0", start_time=start_time)
    try:
        assert stub.is_alive() and not stub.is_stopped()
        os.kill(child.pid, signal.SIGSTOP)
        wait_for(stub.is_stopped, 5, "the process to be stopped")
        assert stub.is_alive()
        os.kill(child.pid, signal.SIGCONT)
        wait_for(lambda: not stub.is_stopped(), 5, "the process to run again")
    finally:
        child.kill()
        child.wait()


def test_loop_watch_counts_only_time_the_stub_runs_with_a_still_heartbeat() -> None:
    watch = LoopWatch(max_gap_s=2.0)
    assert watch.observe(0.0, None, running=True) == 0.0  # no heartbeat: nothing to watch
    assert watch.observe(1.0, 100, running=True) == 0.0  # first beat seen
    assert watch.observe(2.0, 100, running=True) == 1.0
    assert watch.observe(3.5, 100, running=True) == 2.5
    assert watch.observe(4.0, 200, running=True) == 0.0  # it moved
    # stopped (SIGSTOP) for 10 s: none of it counts, however long
    for now in range(5, 15):
        assert watch.observe(float(now), 200, running=False) == 0.0
    assert watch.observe(15.0, 200, running=True) == 1.0
    # a supervisor that was not scheduled for 60 s counts at most max_gap_s of it
    assert watch.observe(75.0, 200, running=True) == 3.0
    assert watch.observe(76.0, None, running=True) == 0.0  # removed (loop stopped on purpose)
    assert watch.observe(77.0, 200, running=True) == 0.0


def test_heartbeat_file_is_renewed_at_most_every_interval_and_removed_on_stop(tmp_path: Path) -> None:
    from trispec.serving.loop import Heartbeat

    beat = Heartbeat(tmp_path / "specdec_0_0", interval_s=0.2)
    beat.beat()
    first = beat.path.stat().st_mtime_ns
    beat.beat()  # within the interval: no syscall, same mtime
    assert beat.path.stat().st_mtime_ns == first
    time.sleep(0.25)
    beat.beat()
    assert beat.path.stat().st_mtime_ns > first
    beat.remove()
    assert not beat.path.exists()
    broken = Heartbeat(tmp_path / "gone" / "specdec_0_0", interval_s=0.0)
    broken.beat()  # the directory is gone (server stopping): logged, never raised
    broken.beat()


def fake_ipc_region(name: str, ref_count: int = 1, flags: bytes = b"\x00\x00\x00\x01") -> tuple[Path, int]:
    """A shm file holding an IPC control block laid out as Triton 2.51's, at offset 336 (as seen)."""
    handle, size = 336, 1 << 16
    data = bytearray(size)
    struct.pack_into("<I", data, handle, ref_count)
    data[handle + 16 : handle + 20] = flags
    struct.pack_into("<5Q", data, handle + 16 + 88, 496, 8688, 16880, 25072, 33264)
    path = SHM_DIR / name
    path.write_bytes(bytes(data))
    return path, handle


def test_stub_health_flag_writes_only_a_block_laid_out_as_triton_2_51s() -> None:
    name = f"{shm_prefix()}flagtest"
    path, handle = fake_ipc_region(name)
    try:
        stub = StubProcess(os.getpid(), "x_0_0", 0, shm_region=name, ipc_control=handle)
        before = bytearray(path.read_bytes())
        flag = StubHealthFlag(stub)
        flag.set()
        flag.close()
        before[handle + 16] = 1  # stub_health, and nothing else
        assert path.read_bytes() == before
        for _ in (
            fake_ipc_region(name, ref_count=0),
            fake_ipc_region(name, flags=b"\x07\x00\x00\x01"),
        ):
            with pytest.raises(TritonServerError, match="not laid out"):
                StubHealthFlag(stub)
        with pytest.raises(TritonServerError, match="beyond"):
            StubHealthFlag(StubProcess(os.getpid(), "x_0_0", 0, shm_region=name, ipc_control=(1 << 16) - 8))
        with pytest.raises(TritonServerError, match="argv"):
            StubHealthFlag(StubProcess(os.getpid(), "x_0_0", 0))
    finally:
        path.unlink(missing_ok=True)


# --- the CLI, no server ----------------------------------------------------------------------------


def test_cli_bad_config_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: {checkpoint: {path: /tmp}}\ndrafter: {kind: magic}\n")
    assert launcher.main(["--config", str(bad), "--model-repository", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec-serve: error: drafter.kind")
    assert launcher.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_loop_stall_timeout_reaches_the_policy_and_is_not_negative() -> None:
    assert launcher.parse_args([]).loop_stall_timeout == SupervisorPolicy().loop_stall_s == 30.0
    assert launcher.parse_args(["--loop-stall-timeout", "0"]).loop_stall_timeout == 0.0
    with pytest.raises(SystemExit):
        launcher.parse_args(["--loop-stall-timeout", "-1"])


@pytest.mark.parametrize("taken_option", ["--http-port", "--grpc-port", "--metrics-port"])
def test_cli_names_the_taken_port(taken_option: str, repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ports = dict(zip(["--http-port", "--grpc-port", "--metrics-port"], free_ports()))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[taken_option]))
        holder.listen()
        argv = ["--no-prepare", "--model-repository", str(repo)]
        for option, port in ports.items():
            argv += [option, str(port)]
        assert launcher.main(argv) == 1
    err = capsys.readouterr().err
    assert f"{taken_option} {ports[taken_option]} on 127.0.0.1: already in use" in err


# --- a real server -----------------------------------------------------------------------------------


@pytest.mark.server
def test_server_serves_an_infer_and_stops_cleanly(options: ServerOptions) -> None:
    import tritonclient.http as httpclient

    server = TritonServer(options)
    server.start()
    try:
        assert server.wait_ready(60)
        stubs = server.stubs()
        assert sorted(s.instance for s in stubs) == ["echo_0_0", "stream_0_0"]
        assert shm_files(server.shm_prefix), "the Python backend should use the launch's shm prefix"
        client = httpclient.InferenceServerClient(f"127.0.0.1:{options.http_port}", network_timeout=10)
        values = np.array([1.5, -2.0, 3.25], dtype=np.float32)
        infer_input = httpclient.InferInput("IN", list(values.shape), "FP32")
        infer_input.set_data_from_numpy(values)
        result = client.infer("echo", [infer_input])
        np.testing.assert_array_equal(result.as_numpy("OUT"), values)
        client.close()
    finally:
        code = server.stop()
    assert code == 0, "SIGTERM should end tritonserver cleanly"
    assert shm_files(server.shm_prefix) == []
    assert not any(s.is_alive() for s in stubs)
    assert not server.is_ready()


def system_root_like(install: TritonInstallation, root: Path) -> Path:
    """An install tree shaped like NVIDIA's /opt/tritonserver, made of links into the wheel."""
    (root / "bin").mkdir(parents=True)
    (root / "backends" / "python").mkdir(parents=True)
    (root / "bin" / "tritonserver").symlink_to(install.binary)
    for source in (
        install.python_backend / "libtriton_python.so",
        install.python_backend / "triton_python_backend_utils.py",
        install.stub,
    ):
        (root / "backends" / "python" / source.name).symlink_to(source)
    (root / "lib").symlink_to(install.libs)
    return root


def test_a_system_tritonserver_root_is_used_when_named(
    install: TritonInstallation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = system_root_like(install, tmp_path / "opt-tritonserver")
    monkeypatch.setenv(SERVER_ROOT_ENV, str(root))
    found = TritonInstallation.locate()
    assert (
        found.binary == root / "bin/tritonserver"
        and found.stub == root / "backends/python" / install.stub.name
    )
    assert found.libs == root / "lib"
    monkeypatch.setenv(SERVER_ROOT_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TritonServerError, match="SPECDEC_TRITONSERVER_ROOT"):
        TritonInstallation.locate()


@pytest.mark.server
def test_server_from_a_system_root_serves(
    install: TritonInstallation, options: ServerOptions, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tritonclient.http as httpclient

    monkeypatch.setenv(SERVER_ROOT_ENV, str(system_root_like(install, tmp_path / "root")))
    server = TritonServer(options)
    assert server.install.binary.parent.parent == tmp_path / "root"
    server.start()
    try:
        assert server.wait_ready(60)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{options.http_port}", network_timeout=10)
        assert client.is_model_ready("echo")
        client.close()
    finally:
        assert server.stop() == 0


def add_broken_model(repository: Path) -> None:
    """A model whose initialize() raises: tritonserver then exits at start-up."""
    version_dir = repository / "broken" / "1"
    version_dir.mkdir(parents=True)
    echo_config = (repository / "echo" / "config.pbtxt").read_text()
    (version_dir.parent / "config.pbtxt").write_text(echo_config.replace('"echo"', '"broken"'))
    (version_dir / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('no weights here')\n"
    )


def run_in_thread(supervisor: Supervisor) -> tuple[threading.Thread, list[int]]:
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(supervisor.run()), daemon=True)
    thread.start()
    return thread, codes


@pytest.mark.server
def test_a_failed_start_reports_the_log_and_is_not_retried(options: ServerOptions) -> None:
    add_broken_model(options.model_repository)
    server = TritonServer(options)
    server.start()
    try:
        with pytest.raises(TritonServerError, match=r"(?s)exited with code .* before ready:.*no weights"):
            server.wait_ready(60)
    finally:
        server.stop()
    assert shm_files(server.shm_prefix) == []

    started = time.monotonic()
    assert Supervisor(options, SupervisorPolicy(ready_timeout_s=60)).run() == 1
    assert time.monotonic() - started < 15, "a broken first start should fail at once"


@pytest.mark.server
def test_supervisor_gives_up_when_restarts_keep_failing(options: ServerOptions) -> None:
    policy = SupervisorPolicy(ready_timeout_s=60, max_start_failures=2, backoff_initial_s=0.2)
    supervisor = Supervisor(options, policy)
    thread, codes = run_in_thread(supervisor)
    try:
        wait_for(supervisor.ready.is_set, 60, "the first server to be ready")
        first = supervisor.server
        assert first is not None and first.pid is not None
        add_broken_model(options.model_repository)  # from now on every start fails
        os.kill(first.pid, signal.SIGKILL)
        thread.join(timeout=60)
    finally:
        supervisor.stop()
        thread.join(timeout=30)
    assert codes == [1]
    assert supervisor.restarts == 1
    assert not supervisor.ready.is_set()


def _stream_request(client: Any, count: int, delay_s: float) -> None:
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("COUNT", [1], "INT32"), grpcclient.InferInput("DELAY_S", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([count], dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array([delay_s], dtype=np.float32))
    client.async_stream_infer("stream", inputs, enable_empty_final_response=True)


def _open_stream(port: int) -> tuple[Any, queue.Queue]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    responses: queue.Queue = queue.Queue()
    # stream_timeout: the client-side deadline, so a dead server can never hang this test
    client.start_stream(lambda result, error: responses.put((result, error)), stream_timeout=30)
    return client, responses


@contextlib.contextmanager
def supervise(options: ServerOptions, policy: SupervisorPolicy) -> Iterator[Supervisor]:
    """A supervisor serving in a thread, once ready; stopped (and its shm files checked) after."""
    prefixes: list[str] = []
    supervisor = Supervisor(
        options, policy, on_ready=lambda server, _restarts: prefixes.append(server.shm_prefix)
    )
    thread, codes = run_in_thread(supervisor)
    try:
        wait_for(supervisor.ready.is_set, 60, "the first server to be ready")
        yield supervisor
    finally:
        supervisor.stop()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the supervisor did not stop"
    assert codes == [0]
    for prefix in prefixes:
        assert shm_files(prefix) == [], f"shm files of {prefix} were left behind"


@pytest.fixture
def supervised(options: ServerOptions) -> Iterator[Supervisor]:
    # quick to call a hung server unhealthy, so the test stays short
    with supervise(
        options, SupervisorPolicy(ready_timeout_s=60, probe_timeout_s=0.5, readiness_failures=2)
    ) as sup:
        yield sup


def _collect(responses: queue.Queue, timeout_s: float) -> tuple[list[int], Exception | None]:
    """A ``stream`` request's INDEX values up to its final response, or up to an error (returned)."""
    indices: list[int] = []
    while True:
        result, error = responses.get(timeout=timeout_s)
        if error is not None:
            return indices, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            return indices, None
        indices.append(int(result.as_numpy("INDEX")[0]))


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


@pytest.mark.server
def test_cli_serves_until_sigterm_then_cleans_up(repo: Path, tmp_path: Path) -> None:
    http, grpc, metrics = free_ports()
    stdout = tmp_path / "stdout.txt"
    command = [
        str(Path(sys.executable).parent / "specdec-serve"),
        *("--no-prepare", "--model-repository", str(repo), "--log-file", str(tmp_path / "server.log")),
        *("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)),
    ]
    with stdout.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"ready:" in stdout.read_bytes() or process.poll() is not None, 60, "ready")
        assert process.poll() is None, stdout.read_text()
        assert f"HTTP http://127.0.0.1:{http}" in stdout.read_text()
        stubs = find_stubs(process.pid)  # descendants of the launcher
        assert len(stubs) == 2
        assert shm_files(f"{SHM_PREFIX_ROOT}{process.pid}_")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, stdout.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "specdec-serve: stopped" in stdout.read_text()
    assert shm_files(f"{SHM_PREFIX_ROOT}{process.pid}_") == []
    assert not any(s.is_alive() for s in stubs)
