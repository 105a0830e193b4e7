"""A real ``specdec-serve`` (tritonserver with the default models or a given config) for the tests
that talk to it: start it on free ports, wait until ready, read its metrics, stop it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def free_ports(count: int = 3) -> list[int]:
    """Ports the kernel hands out as free right now (all held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``condition`` until true; return the seconds it took; fail after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    http: str
    grpc: str
    metrics: str
    log: Path
    admin_key_file: Path

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/v2/health/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        assert self.has_metric(name, **labels), f"metric {name} {labels} not exported"
        return self.metric_or_zero(name, **labels)

    def has_metric(self, name: str, **labels: str) -> bool:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return any(
            line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items())
            for line in text.splitlines()
        )

    def metric_or_zero(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none yet)."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        total, found = 0.0, False
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        return total if found else 0.0


def start_server(
    tmp: Path, *args: str, log_name: str = "server.log", keep_admin_key_env: bool = True
) -> Server:
    """``specdec-serve`` on free ports with ``args`` added; returns once ready (fails the test if it
    never is). Its repository lives in ``tmp``, its output goes to ``tmp / log_name``."""
    http, grpc, metrics = free_ports()
    log = tmp / log_name
    command = [
        str(BIN / "specdec-serve"),
        "--model-repository", str(tmp / "repo"),
        "--http-port", str(http),
        "--grpc-port", str(grpc),
        "--metrics-port", str(metrics),
        *args,
    ]  # fmt: skip
    env = dict(os.environ)
    if not keep_admin_key_env:
        env.pop("SPECDEC_ADMIN_KEY", None)
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    key_file = Path(args[args.index("--admin-key-file") + 1]) if "--admin-key-file" in args else tmp / "none"
    srv = Server(process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log, key_file)
    deadline = time.monotonic() + 240
    while not srv.ready():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"specdec-serve did not become ready:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return srv


def stop_server(srv: Server) -> None:
    """SIGTERM; the launcher must exit 0 (a clean stop)."""
    srv.process.send_signal(signal.SIGTERM)
    try:
        assert srv.process.wait(timeout=60) == 0, srv.log.read_text()[-3000:]
    finally:
        if srv.process.poll() is None:
            srv.process.kill()


@contextmanager
def openai_frontend(grpc_url: str, log: Path) -> Iterator[str]:
    """``specdec-openai`` in front of a server's gRPC port for the length of the block; yields its
    base URL once /health answers (its output goes to ``log``)."""
    port = free_port()
    command = [str(BIN / "specdec-openai"), "--triton-url", grpc_url, "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not _answers(f"{url}/health"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"specdec-openai did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        finally:
            if process.poll() is None:
                process.kill()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
