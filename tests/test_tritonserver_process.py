"""specdec-serve's handling of the tritonserver process, no server started: locating the bundled
server and the stub for this Python, the backend directory, the environment, the command line, shm
prefixes and stale shm files, process liveness, the loop watch, the heartbeat file and the stub's
health flag.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from served import wait_for
from trispec.serving.supervisor import LoopWatch, SupervisorPolicy, retry_delay_s
from trispec.serving.tritonserver import (
    SHM_DIR,
    SHM_PREFIX_ROOT,
    ServerOptions,
    StubHealthFlag,
    StubProcess,
    TritonInstallation,
    TritonServerError,
    build_command,
    prepare_backend_directory,
    probe_host,
    process_start_time,
    remove_stale_shm,
    server_environment,
    shm_prefix,
)


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
