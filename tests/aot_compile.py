"""The ahead-of-time compile of every Triton kernel (scripts/triton_aot.py), started in the background
as soon as ``tests/test_triton_aot.py`` is collected (``conftest.py``), at the lowest priority: its
minutes of compiling take the CPU the rest of the suite leaves idle, and the test then reads its
result. Run alone, the test waits for it. An empty Triton cache of its own: every variant compiles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "test_triton_aot.py::test_every_kernel_compiles_for_the_gpu_at_every_launch"


@dataclass
class Compile:
    process: subprocess.Popen
    workdir: Path
    archs: list[str]

    @property
    def variants(self) -> Path:
        return self.workdir / "variants.json"

    def wait(self, timeout: float) -> tuple[int, str, str]:
        out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, out, err

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
        shutil.rmtree(self.workdir, ignore_errors=True)


_running: Compile | None = None


def start() -> Compile:
    """The compile for ``TRISPEC_AOT_ARCHS`` (default sm_90), started once."""
    global _running
    if _running is None:
        workdir = Path(tempfile.mkdtemp(prefix="triton-aot-"))
        archs = os.environ.get("TRISPEC_AOT_ARCHS", "90").split(",")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(workdir / "cache")
        command = ["nice", "-n", "19", sys.executable, str(ROOT / "scripts" / "triton_aot.py"),
                   *[f"--arch={a}" for a in archs], "--json", str(workdir / "variants.json")]  # fmt: skip
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        _running = Compile(process, workdir, archs)
    return _running


def stop() -> None:
    if _running is not None:
        _running.stop()
