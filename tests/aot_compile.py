"""The ahead-of-time compile of every Triton kernel (scripts/triton_aot.py), started in the background
as soon as ``tests/test_triton_aot.py`` is collected (``conftest.py``), at the lowest priority: its
minutes of compiling take the CPU the rest of the suite leaves idle, and the test then reads its
result. Run alone, the test waits for it. An empty Triton cache of its own: every variant compiles.

Once a session: under pytest-xdist the controller starts it (the workers each collect every test)
and tells every worker its folder (``WORKDIR_KEY`` in ``workerinput``); the compile writes its output,
its errors and at last its exit status there, which is what the test waits for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "test_triton_aot.py::test_every_kernel_compiles_for_the_gpu_at_every_launch"
WORKDIR_KEY = "trispec_aot_workdir"


@dataclass
class Compile:
    workdir: Path
    archs: list[str]
    process: subprocess.Popen | None = None  # None: another process (the xdist controller) runs it

    @property
    def variants(self) -> Path:
        return self.workdir / "variants.json"

    def wait(self, timeout: float) -> tuple[int, str, str]:
        status = self.workdir / "status"
        deadline = time.monotonic() + timeout
        while not status.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the ahead-of-time compile in {self.workdir} did not end in {timeout:g} s"
                )
            time.sleep(0.5)
        out, err = ((self.workdir / name).read_text() for name in ("out", "err"))
        return int(status.read_text()), out, err

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # the whole group: killing the shell alone left the compile running for minutes after a
            # session that ended first (--collect-only, -x, Ctrl-C)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_running: Compile | None = None
_workdir: Path | None = None


def workdir() -> Path:
    """This session's folder for the compile (made once)."""
    global _workdir
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="triton-aot-"))
    return _workdir


def _archs() -> list[str]:
    return os.environ.get("TRISPEC_AOT_ARCHS", "90").split(",")


def start() -> Compile:
    """The compile for ``TRISPEC_AOT_ARCHS`` (default sm_90), started once into ``workdir()``."""
    global _running
    if _running is None:
        folder = workdir()
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(folder / "cache")
        command = ["nice", "-n", "19", sys.executable, str(ROOT / "scripts" / "triton_aot.py"),
                   *[f"--arch={a}" for a in _archs()], "--json", str(folder / "variants.json")]  # fmt: skip
        # the exit status is written last, by the shell, once the output files are complete
        script = 'exec 1>"$0/out" 2>"$0/err"; "$@"; echo $? > "$0/status.tmp"; mv "$0/status.tmp" "$0/status"'
        # a session of its own: stop() ends the shell, the compile and its pool's workers together
        process = subprocess.Popen(
            ["sh", "-c", script, str(folder), *command], env=env, start_new_session=True
        )
        _running = Compile(folder, _archs(), process)
    return _running


def follow(folder: str) -> None:
    """In an xdist worker: the compile is the controller's, in ``folder``."""
    global _running, _workdir
    _workdir = Path(folder)
    _running = Compile(_workdir, _archs())


def stop() -> None:
    if _running is not None and _running.process is not None:
        _running.stop()
    elif _running is None and _workdir is not None:  # made for the workers, never used: no compile ran
        shutil.rmtree(_workdir, ignore_errors=True)
