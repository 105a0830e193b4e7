"""Who runs: waiting requests start while the batch has room and the runner's KV has their first
step; under overload a request waiting too long takes the place of a running one; and a step that
would not fit the KV pool preempts the most recently admitted sequence (freed, queued first,
recomputed)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from trispec.config import SchedulerConfig
from trispec.runners.base import SpecRunner
from trispec.sequence import Sequence
from trispec.stats import EngineStats
from trispec.step import SeqStep


class Admission:
    """Admission and preemption (a part of ``Scheduler``)."""

    # the scheduler's
    runner: SpecRunner
    config: SchedulerConfig
    clock: Callable[[], float]
    stats: EngineStats
    waiting: deque[Sequence]
    running: list[Sequence]
    urgent_after_s: float | None

    def _admit(self) -> None:
        while self.waiting and self._fits_now(self.waiting[0]):
            self._start(self.waiting.popleft())
        if self.urgent_after_s is not None:
            self._admit_urgent(self.urgent_after_s)

    def _fits_now(self, seq: Sequence) -> bool:
        # its first step: every verified token and the drafts
        return len(self.running) < self.config.max_batch_size and self.runner.can_admit(
            seq.token_ids, seq.sampling, seq.num_draft_tokens, seq.cache_salt
        )

    def _start(self, seq: Sequence) -> None:
        # the prefix cache may hold its first tokens: only the rest is fed (at least the last)
        admitted = self.runner.add(
            seq.seq_id, seq.max_length, seq.sampling, seq.drafts, seq.token_ids, seq.cache_salt
        )
        seq.num_computed = admitted.cached
        # what the draft pool's prefix cache gave: the adaptive controller weighs only the rest
        # of the catch-up when deciding whether this sequence starts drafting
        seq.draft_synced = admitted.draft_cached
        seq.admitted_at = self.clock()
        if seq.first_scheduled_ns is None:
            seq.first_scheduled_ns = time.time_ns()
        self.running.append(seq)

    def _admit_urgent(self, after_s: float) -> None:
        """Overload: a request not started after ``after_s`` takes the place of the most recently
        admitted sequence that has streamed for at least as long (preempted, it resumes later), so
        time to first token stays bounded while the batch or the KV pool is full. The requests
        still waiting are refused by the serving loop at ``max_queue_delay_s``."""
        now = self.clock()
        urgent = [s for s in self.waiting if not s.preemptions and now - s.arrived_at >= after_s]
        for seq in urgent:
            while not self._fits_now(seq):
                victim = self._victim(min_run_s=after_s)
                if victim is None:
                    return
                self._preempt(victim)
            self.waiting.remove(seq)
            self._start(seq)

    def _fit(self, steps: list[SeqStep]) -> list[SeqStep]:
        """KV blocks are taken as sequences grow: while the step would not fit the runner's pool,
        preempt the most recently admitted sequence. A lone sequence always fits without drafts
        (prompt + max_tokens <= max_context <= the pool)."""
        while steps and not self.runner.room_for(steps):
            if len(self.running) > 1:
                victim = self._victim() or self.running[-1]
                self._preempt(victim)
                steps = [s for s in steps if s.seq_id != victim.seq_id]
            elif any(s.num_draft_tokens for s in steps):
                steps = [replace(s, num_draft_tokens=0) for s in steps]
            else:
                break  # cannot happen within max_context; the runner then fails the sequence
        return steps

    def _victim(self, min_run_s: float = 0.0) -> Sequence | None:
        """The most recently admitted sequence that has streamed a token (a request's first token is
        never delayed by preemption) and has run for at least ``min_run_s`` since its admission."""
        now = self.clock()
        return next(
            (s for s in reversed(self.running) if s.output_ids and now - s.admitted_at >= min_run_s), None
        )

    def _preempt(self, seq: Sequence) -> None:
        """Free the sequence's KV and queue it first in line; re-admitted, it recomputes its verified
        tokens (the text it already sent stays sent and is never sent again)."""
        self.runner.preempt(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.draft_synced = 0
        seq.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)
