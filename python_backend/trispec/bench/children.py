"""The processes a served benchmark starts, and what they leave: each child told to stop when the bench
dies (even by SIGKILL), and their descendants (tritonserver, its Python-backend stubs) recorded while
they run, so that after the stop the bench can say whether any is left."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_DEATHSIG = 1


def stop_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it dies, so a benchmark killed
    with -9 still has its servers stop cleanly (they handle SIGTERM) instead of holding their ports."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Process:
    pid: int
    start_time: int  # /proc/<pid>/stat starttime: a reused pid is another process
    name: str

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[3] == self.start_time and stat[1] not in ("Z", "X")

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _stat(pid: int) -> tuple[str, str, int, int] | None:
    """(name, state, ppid, starttime) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the name (field 2) may hold spaces and parentheses: split after its closing parenthesis
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> list[Process]:
    """Every live process below ``root`` (children, grandchildren, ...), as it stands now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[2], []).append(int(entry.name))
    found: list[Process] = []
    frontier = [root]
    while frontier:
        for pid in children.get(frontier.pop(), []):
            stat = _stat(pid)
            if stat is not None and stat[1] not in ("Z", "X"):
                found.append(Process(pid, stat[3], stat[0]))
            frontier.append(pid)
    return found


def left_behind(recorded: list[Process], wait_s: float = 15.0) -> list[Process]:
    """Those of ``recorded`` still running after up to ``wait_s`` (after their parent was stopped:
    orphans). A process its parent killed may take a moment to go (its memory is freed first)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in recorded if p.alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
