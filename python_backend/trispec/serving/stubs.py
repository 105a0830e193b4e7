"""The Python backend stubs under a tritonserver: found through /proc, told dead from alive (or only
stopped), and kept healthy in Triton's eyes while they exist (``StubHealthFlag``)."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from trispec.errors import TritonServerError
from trispec.serving.shm import SHM_DIR
from trispec.serving.triton_install import STUB_NAME


@dataclass(frozen=True)
class StubProcess:
    """A Python backend stub: one per model instance (``instance`` is e.g. ``echo_0_0``)."""

    pid: int
    instance: str
    start_time: int  # /proc/<pid>/stat starttime: tells a reused pid from the original
    # where Triton keeps this stub's IPC control block (its argv[2] and argv[7]), see StubHealthFlag
    shm_region: str = ""
    ipc_control: int = 0

    def is_alive(self) -> bool:
        """False once the stub has exited: gone, a zombie (Triton does not reap it), or pid reused.
        A stopped stub (SIGSTOP, a debugger) is alive: it carries on where it was when continued."""
        stat = _read_stat(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and stat[2] == self.start_time

    def is_stopped(self) -> bool:
        """True while the stub is stopped by a signal or a tracer: alive, but none of it runs."""
        stat = _read_stat(self.pid)
        return stat is not None and stat[0] in ("T", "t") and stat[2] == self.start_time


def _read_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after its closing parenthesis
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    stat = _read_stat(pid)
    return stat[2] if stat is not None else None


def _descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name))
        if stat is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, frontier = [], [root_pid]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def find_stubs(server_pid: int) -> list[StubProcess]:
    """Live Python backend stubs below ``server_pid``.

    Triton first runs ``sh -c <stub>`` once to check the stub starts; that process has no model
    arguments and is skipped, as are zombies.
    """
    stubs = []
    for pid in _descendants(server_pid):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        is_stub = (comm != "" and STUB_NAME.startswith(comm)) or argv[0].endswith(STUB_NAME.encode())
        stat = _read_stat(pid)
        # argv: stub model.py shm_region shm_default shm_growth parent_pid backend_dir ipc instance ...
        if not is_stub or stat is None or stat[0] in ("Z", "X") or len(argv) < 9:
            continue
        try:
            ipc_control = int(argv[7])
        except ValueError:
            ipc_control = 0
        stubs.append(
            StubProcess(
                pid=pid,
                instance=argv[8].decode(errors="replace"),
                start_time=stat[2],
                shm_region=argv[2].decode(errors="replace"),
                ipc_control=ipc_control,
            )
        )
    return stubs


# The Python backend's IPC control block as python_backend r24.10 (Triton 2.51) lays it out in the
# stub's shm region: a 16-byte ownership header (shm_manager.h, AllocatedShmOwnership: uint32 ref
# count, alignas 16), then IPCControlShm (pb_utils.h): bool stub_health, parent_health, uses_env,
# decoupled; two pthread mutexes (40 bytes each, from byte 8); five uint64 queue handles (from byte 88).
_OWNERSHIP_BYTES = 16
_CONTROL_BYTES = 88 + 5 * 8


class StubHealthFlag:
    """Sets a stub's health flag in Triton's shared memory, as the stub's own health thread does.

    Why: when Triton hands a request to a stub (``ProcessRequests``, python_be.cc) it clears this flag
    and waits for the stub's reply in 1-second slices (``StubLauncher::ReceiveMessageFromStub``,
    stub_launcher.cc); the stub's background thread sets the flag every 300 ms (pb_stub.cc). If a
    slice ends with the flag still clear (the stub is stopped, or starved of CPU, for over about a
    second) Triton fails the request with "Stub process '<instance>' is not healthy", frees the
    request's shared memory and stops waiting, but the execute message stays queued: when the stub
    runs again it reads that freed memory and dies (SIGSEGV, seen on 2.51), taking every open stream
    with it. Both timeouts are hard-coded; the ``stub-timeout-seconds`` backend option is parsed but
    unused in this version.

    The supervisor sets the flag while the stub process exists (stopped or not), so Triton keeps
    waiting for a stub that is only slow, and lets it clear once the stub has exited, so a dead stub
    is still reported within a second or two. The layout is checked before anything is written; a
    Triton whose block looks different raises TritonServerError here and is left alone.
    """

    def __init__(self, stub: StubProcess) -> None:
        self.stub = stub
        self._offset = stub.ipc_control + _OWNERSHIP_BYTES
        if not stub.shm_region or stub.ipc_control <= 0 or "/" in stub.shm_region:
            raise TritonServerError(f"stub {stub.instance}: no shm region or IPC control handle in its argv")
        self._fd = os.open(SHM_DIR / stub.shm_region, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._check_layout()
        except BaseException:
            os.close(self._fd)
            raise

    def _check_layout(self) -> None:
        size = os.fstat(self._fd).st_size
        block = os.pread(self._fd, _OWNERSHIP_BYTES + _CONTROL_BYTES, self.stub.ipc_control)
        if len(block) < _OWNERSHIP_BYTES + _CONTROL_BYTES:
            raise TritonServerError(f"stub {self.stub.instance}: IPC control block beyond its shm region")
        (ref_count,) = struct.unpack_from("<I", block, 0)
        flags = block[_OWNERSHIP_BYTES : _OWNERSHIP_BYTES + 4]
        handles = struct.unpack_from("<5Q", block, _OWNERSHIP_BYTES + 88)
        looks_right = (
            1 <= ref_count <= 4
            and all(b in (0, 1) for b in flags)
            and all(0 < h < size for h in handles)
            and len(set(handles)) == len(handles)
        )
        if not looks_right:
            raise TritonServerError(
                f"stub {self.stub.instance}: the IPC control block is not laid out as in Triton 2.51 "
                "(python_backend r24.10); its health flag is left alone"
            )

    def set(self) -> None:
        # one byte, written through the same tmpfs pages Triton and the stub map
        os.pwrite(self._fd, b"\x01", self._offset)

    def close(self) -> None:
        os.close(self._fd)
