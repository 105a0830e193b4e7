"""A clock the client tests put in place of the ``time`` module of the client code under test: its
pauses (``sleep``) return at once and are recorded, and its ``monotonic()`` is the real clock plus
every pause taken. So a test reads the waits the code chose (a backoff schedule, a deadline's last
pause) instead of timing them on a loaded machine, while whatever really takes time (a refused
connection, a probe) still counts. ``VirtualQueue`` does the same for a wait on a queue."""

from __future__ import annotations

import queue
import time
from typing import Any


class VirtualClock:
    def __init__(self) -> None:
        self.pauses: list[float] = []  # every sleep, in order

    def monotonic(self) -> float:
        return time.monotonic() + sum(self.pauses)

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.pauses.append(seconds)

    def __getattr__(self, name: str) -> Any:  # anything else from the real module
        return getattr(time, name)


class VirtualQueue(queue.Queue):
    """A queue whose ``get`` on an empty queue takes its whole timeout on ``clock`` at once, and
    refuses to wait for ever (the code under test would hang)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            return super().get(block=False)
        except queue.Empty:
            if block:
                assert timeout is not None, "a wait without a timeout: the code would hang here"
                self.clock.sleep(timeout)
            raise
