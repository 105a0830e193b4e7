"""Where and when a benchmark ran, for its header: the date, the CPU's model and the ISA extensions that
decide which kernels run, the threads used, and the commit of the code measured."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path
from typing import Any

import torch

# the extensions our kernels and llama.cpp's pick their code by
ISA_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
    "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip


def cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def isa_flags(cpuinfo: str) -> list[str]:
    """The extensions of ``ISA_FLAGS`` the CPU reports (first processor's flags), in that order."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [f for f in ISA_FLAGS if f in present]
    return []


def commit(where: Path | None = None) -> str:
    """The short commit of the checkout holding this code, ``-dirty`` with uncommitted changes to
    tracked files; "unknown" outside a git checkout."""
    where = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown"
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def machine(threads: int) -> dict[str, Any]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_model(cpuinfo),
        "isa": isa_flags(cpuinfo),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": threads,
        "commit": commit(),
    }
