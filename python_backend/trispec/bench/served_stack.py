"""Our served stack for ``specdec-bench-served``: ``specdec-serve`` (tritonserver + the model) on free
ports and ``specdec-openai`` in front of it, both on one config; started, waited for, stopped.

Each runs in a session of its own (a Ctrl-C in the terminal reaches the bench only, which then stops
them in order: the endpoint, then the server, whose launcher stops tritonserver and its stubs), and
gets SIGTERM if the bench dies. The server's descendants are recorded while it runs; ``close`` returns
those still running after the stop (none expected) after killing them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from trispec.bench.children import Process, descendants, free_port, left_behind, stop_with_parent

READY_TIMEOUT_S = 900.0  # a first start joins part packages and converts a tokenizer
STOP_TIMEOUT_S = 60.0


def _script(name: str) -> str:
    """A console script of this installation (beside the interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (pip install -e . installs it)")
    return found


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class OurStack:
    """``specdec-serve --config CONFIG`` and ``specdec-openai --config CONFIG``; ``url`` is the
    endpoint's base (``http://127.0.0.1:PORT``), ``model`` the name it serves."""

    def __init__(self, config: Path, model: str, workdir: Path) -> None:
        self.config, self.model, self.workdir = config, model, workdir
        self.serve: subprocess.Popen[bytes] | None = None
        self.openai: subprocess.Popen[bytes] | None = None
        self.url = ""
        self._recorded: dict[tuple[int, int], Process] = {}

    def __enter__(self) -> OurStack:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        leftovers = self.close()
        if leftovers:
            names = ", ".join(f"{p.name} (pid {p.pid})" for p in leftovers)
            print(f"specdec-bench-served: left running after the stop, killed: {names}", file=sys.stderr)

    def _spawn(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=stop_with_parent,
            )

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        http, grpc, metrics, openai = free_port(), free_port(), free_port(), free_port()
        serve_log = self.workdir / "specdec-serve.log"
        self.serve = self._spawn(
            [
                _script("specdec-serve"), "--config", str(self.config),
                "--model-repository", str(self.workdir / "repository"),
                "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                "--admin-key-file", str(self.workdir / "admin-key"),
                "--log-file", str(self.workdir / "tritonserver.log"),
            ],
            serve_log,
        )  # fmt: skip
        self._wait(self.serve, f"http://127.0.0.1:{http}/v2/health/ready", "specdec-serve", serve_log)
        self._record()
        openai_log = self.workdir / "specdec-openai.log"
        self.openai = self._spawn(
            [
                _script("specdec-openai"), "--config", str(self.config), "--model", self.model,
                "--triton-url", f"127.0.0.1:{grpc}", "--port", str(openai), "--log-level", "warning",
            ],
            openai_log,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{openai}"
        self._wait(self.openai, f"{self.url}/health", "specdec-openai", openai_log)

    def _wait(self, process: subprocess.Popen[bytes], url: str, name: str, log: Path) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _answers(url):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}) before ready:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready within {READY_TIMEOUT_S:.0f} s:\n{_tail(log)}")
            time.sleep(0.5)

    def _record(self) -> None:
        """Remember the server's descendants (tritonserver, stubs) as they are now."""
        if self.serve is not None and self.serve.poll() is None:
            for p in descendants(self.serve.pid):
                self._recorded[(p.pid, p.start_time)] = p

    def close(self) -> list[Process]:
        """Stop the endpoint, then the server (SIGTERM: a clean stop); return what was left running
        of the server's descendants, killed."""
        self._record()  # a stub restarted since the start is a new process
        for process, timeout in ((self.openai, 15.0), (self.serve, STOP_TIMEOUT_S)):
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # its own session: pgid == pid
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.openai = self.serve = None
        leftovers = left_behind(list(self._recorded.values()))
        for p in leftovers:
            p.kill()
        self._recorded.clear()
        return leftovers
