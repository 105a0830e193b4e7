"""The server under test: its address, readiness, metrics and KV state, and the Python stub's memory."""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable

import urllib3

STUB_NAME = "triton_python_backend_stub"


def split_host_port(url: str) -> tuple[str, int]:
    parsed = urllib3.util.parse_url(url if "://" in url else f"http://{url}")
    if not parsed.host or parsed.port is None:
        raise ValueError(f"expected host:port, got {url!r}")
    return parsed.host.strip("[]"), parsed.port


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class Server:
    """Readiness, metrics and the stub's memory of the server under test."""

    def __init__(self, http_url: str, metrics_url: str) -> None:
        self.http_url, self.metrics_url = http_url, metrics_url
        self._pool = urllib3.PoolManager(timeout=urllib3.Timeout(connect=2, read=5), retries=False)

    def ready(self) -> bool:
        try:
            return self._pool.request("GET", f"http://{self.http_url}/v2/health/ready").status == 200
        except Exception:
            return False

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = self._pool.request("GET", f"http://{self.metrics_url}/metrics").data.decode()
        samples = {}
        for line in text.splitlines():
            match = re.match(r"^(specdec_\w+)(?:\{(.*)\})? (\S+)$", line)
            if match:
                labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
                samples[(match.group(1), labels)] = float(match.group(3))
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none yet)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= ls)

    def rejected(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for (name, labels), value in self.metrics().items():
            if name == "specdec_requests_rejected_total":
                reason = dict(labels).get("reason", "")
                counts[reason] = counts.get(reason, 0.0) + value
        return counts

    def kv_state(self) -> tuple[float, float, float, float]:
        """(target blocks used, target blocks not in use, running, waiting). Not in use: free or held by
        the prefix cache, which gives a cached block back whenever a new one is needed."""
        m = self.metrics()

        def get(name: str, **labels: str) -> float:
            return sum(v for (n, ls), v in m.items() if n == name and set(labels.items()) <= ls)

        return (
            get("specdec_kv_blocks_used", pool="target"),
            get("specdec_kv_blocks_free", pool="target") + get("specdec_kv_blocks_cached", pool="target"),
            get("specdec_running_sequences"),
            get("specdec_waiting_sequences"),
        )

    def wait_idle(self, idle_free: float, timeout_s: float) -> tuple[bool, tuple[float, ...], float]:
        """Wait until nothing runs or waits and the target's blocks not in use are back at ``idle_free``."""
        start = time.monotonic()
        state: tuple[float, ...] = ()
        while time.monotonic() - start < timeout_s:
            with contextlib.suppress(Exception):
                state = self.kv_state()
                used, free, running, waiting = state
                if used == 0 and free == idle_free and running == 0 and waiting == 0:
                    return True, state, time.monotonic() - start
            time.sleep(0.2)
        return False, state, time.monotonic() - start


def _find_process(ports: list[int], is_it: Callable[[list[str]], bool]) -> int | None:
    """The pid of a process whose command line ``is_it`` accepts and names one of ``ports`` as its
    --grpc-port or --http-port."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if not cmdline or not is_it(cmdline):
            continue
        flags = " ".join(cmdline)
        if any(re.search(rf"--(?:grpc|http)-port[= ]{port}\b", flags) for port in ports):
            return proc.pid
    return None


def find_server(ports: list[int]) -> int | None:
    """The pid of the tritonserver that listens on one of ``ports`` (its command line says so)."""
    return _find_process(ports, lambda cmdline: cmdline[0].endswith("tritonserver"))


def find_launcher(ports: list[int]) -> int | None:
    """The pid of the ``specdec-serve`` whose command line names one of ``ports``: it may be between
    two tritonservers (its supervisor restarting one)."""
    return _find_process(ports, lambda cmdline: any(part.endswith("specdec-serve") for part in cmdline[:2]))


def wait_for_server(ports: list[int], http_url: str, timeout_s: float) -> int | None:
    """``find_server``, but while a ``specdec-serve`` on ``ports`` restarts its tritonserver, wait up
    to ``timeout_s`` for the new one to be found and ready at ``http_url``. None: no local server."""
    deadline = time.monotonic() + timeout_s
    probe = Server(http_url, "")
    while True:
        server = find_server(ports)
        if server is not None and probe.ready():
            return server
        if (server is None and find_launcher(ports) is None) or time.monotonic() > deadline:
            return server
        time.sleep(0.5)


def find_stub(ports: list[int]) -> int | None:
    """The pid of the Python stub under the tritonserver that listens on one of ``ports``."""
    import psutil

    server = find_server(ports)
    if server is None:
        return None
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(server).children(recursive=True):
            argv = child.cmdline()
            # Triton first runs ``sh -c <stub>`` once as a check: the real stub has its own argv
            if argv and argv[0].endswith(STUB_NAME) and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
    return None


class RssSampler:
    """Samples one process's RSS every ``interval_s`` on a background thread."""

    def __init__(self, pid: int, interval_s: float = 1.0) -> None:
        import psutil

        self.pid, self.interval_s = pid, interval_s
        self._proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self.lost = False  # the process went away (crashed or restarted)
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - self._start, self._proc.memory_info().rss))
            except Exception:
                self.lost = True
                return
            self._stop.wait(self.interval_s)

    def at(self, t: float) -> int | None:
        """The first sample taken at or after ``t`` seconds."""
        return next((rss for s, rss in self.samples if s >= t), None)


def kill_replica(ports: list[int]) -> list[int]:
    """kill -9 of the whole replica that serves on ``ports``, as when its machine is lost: the
    ``specdec-serve`` above its tritonserver (its process group, when it has one of its own), the
    tritonserver's process group (the server and its Python stubs) and anything left under them.
    Never this process's own group. Returns the pids killed."""
    import os
    import signal

    import psutil

    server = find_server(ports)
    if server is None:
        return []
    top = psutil.Process(server)
    with contextlib.suppress(psutil.Error):
        parent = top.parent()
        if parent is not None and any("specdec-serve" in part for part in parent.cmdline()[:2]):
            top = parent
    processes = [top, *top.children(recursive=True)]
    groups = set()
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(process.pid))
    groups.discard(os.getpgrp())
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for process in processes:  # a launcher that shares our group, a child in a group of its own
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(processes, timeout=10)
    return [p.pid for p in processes]
