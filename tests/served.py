"""A real ``specdec-serve`` (tritonserver with the default models or a given config) for the tests
that talk to it: start it on free ports, wait until ready, read its metrics, stop it cleanly."""

from __future__ import annotations

import os
import random
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


# Servers listen on ports below the kernel's ephemeral range (32768 up on Linux), so that no client
# connection or bind(0) elsewhere can take one between the check below and the server's own bind;
# under pytest-xdist each worker takes only the ports p with p % workers == its index, so two workers
# never pick the same one (docs/development.md, "Running the tests in parallel").
SERVER_PORTS = range(20000, 32768)
# its own generator: a test that seeds the module ``random`` must not make two runs pick alike
_port_rng = random.Random()


def _worker_slot() -> tuple[int, int]:
    """(this xdist worker's index, the number of workers); (0, 1) outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    return index % count, count


def free_ports(count: int = 3) -> list[int]:
    """``count`` different ports of this worker's share of ``SERVER_PORTS`` that are free right now
    (each checked by binding it), picked at random so that concurrent runs rarely meet."""
    index, workers = _worker_slot()
    mine = SERVER_PORTS[index::workers]
    ports: list[int] = []
    for port in _port_rng.sample(mine, len(mine)):
        if _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports in {SERVER_PORTS} for worker {index} of {workers}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
    tmp: Path,
    *args: str,
    log_name: str = "server.log",
    keep_admin_key_env: bool = True,
    own_process_group: bool = False,
) -> Server:
    """``specdec-serve`` on free ports with ``args`` added; returns once ready (fails the test if it
    never is). Its repository lives in ``tmp``, its output goes to ``tmp / log_name``.
    ``own_process_group``: in a session of its own, so that a test may kill its whole process group
    (as a lost machine would) without touching pytest's."""
    srv = launch_server(tmp, *args, log_name=log_name, keep_admin_key_env=keep_admin_key_env,
                        own_process_group=own_process_group)  # fmt: skip
    wait_until_ready(srv)
    return srv


def launch_server(
    tmp: Path,
    *args: str,
    log_name: str = "server.log",
    keep_admin_key_env: bool = True,
    own_process_group: bool = False,
) -> Server:
    """``start_server`` without waiting: its ports are known at once, it is ready later."""
    http, grpc, metrics = free_ports()
    tmp.mkdir(parents=True, exist_ok=True)
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
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=own_process_group
        )
    key_file = Path(args[args.index("--admin-key-file") + 1]) if "--admin-key-file" in args else tmp / "none"
    return Server(process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log, key_file)


def wait_until_ready(srv: Server, timeout_s: float = 240) -> None:
    """Fails the test (and kills the server) if it exits or is not ready within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not srv.ready():
        if srv.process.poll() is not None or time.monotonic() > deadline:
            srv.process.kill()
            pytest.fail(f"specdec-serve did not become ready:\n{srv.log.read_text()[-3000:]}")
        time.sleep(0.5)


def stop_server(srv: Server) -> None:
    """SIGTERM; the launcher must exit 0 (a clean stop)."""
    srv.process.send_signal(signal.SIGTERM)
    try:
        assert srv.process.wait(timeout=60) == 0, srv.log.read_text()[-3000:]
    finally:
        if srv.process.poll() is None:
            srv.process.kill()


def kill_server(srv: Server) -> None:
    """A server a test may already have killed: whatever is left of it goes, its shm files too."""
    from trispec.serving.shm import remove_stale_shm

    if srv.process.poll() is None:
        try:
            os.killpg(srv.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            srv.process.kill()
    srv.process.wait(timeout=30)
    remove_stale_shm()


@contextmanager
def openai_frontend(grpc_url: str, log: Path) -> Iterator[str]:
    """``specdec-openai`` in front of a server's gRPC port (or several, comma-separated) for the length
    of the block; yields its base URL once /health answers (its output goes to ``log``)."""
    with openai_frontends([grpc_url], [log]) as urls:
        yield urls[0]


@contextmanager
def openai_frontends(grpc_urls: list[str], logs: list[Path], *options: str) -> Iterator[list[str]]:
    """One ``specdec-openai`` per entry (with ``options`` on each command line), all started at once;
    yields their base URLs once each /health answers."""
    processes, urls = [], []
    try:
        for grpc_url, log in zip(grpc_urls, logs, strict=True):
            port = free_port()
            command = [str(BIN / "specdec-openai"), "--triton-url", grpc_url, "--port", str(port), *options]
            with log.open("wb") as out:
                processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        for process, url, log in zip(processes, urls, logs):
            while not _answers(f"{url}/health"):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"specdec-openai did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        yield urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
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
