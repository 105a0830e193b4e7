"""The serving loop's heartbeat file, which the supervisor watches."""

from __future__ import annotations

import logging
import time
from pathlib import Path

logger = logging.getLogger(__name__)


class Heartbeat:
    """A file whose mtime the loop thread renews at most every ``interval_s``, once per round and
    every 0.1 s when idle: the supervisor restarts the server when it stands still for long while the
    stub runs (a stuck loop would otherwise hang its requests while /v2/health/ready says 200)."""

    def __init__(self, path: Path, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
        self._last = float("-inf")
        self._failed = False

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:  # never fatal to serving; said once
            if not self._failed:
                logger.warning("cannot renew the heartbeat file %s: %s", self.path, exc)
            self._failed = True

    def remove(self) -> None:
        """A loop stopped on purpose is not stuck: take its heartbeat away."""
        self.path.unlink(missing_ok=True)
