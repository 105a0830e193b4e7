"""specdec-serve's command line: a bad config and a taken port are clean errors naming what is wrong,
the loop-stall timeout reaches the policy; and, with the real tritonserver and the tiny test models,
it serves until SIGTERM and then cleans up.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from served import free_ports, wait_for
from tiny_triton import shm_files
from trispec.serving import launcher
from trispec.serving.supervisor import SupervisorPolicy
from trispec.serving.tritonserver import (
    SHM_PREFIX_ROOT,
    find_stubs,
)


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
