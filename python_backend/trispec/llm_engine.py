"""``LLMEngine``: one step = ``schedule()`` -> ``runner.run()`` -> ``postprocess()``.

The scheduler plans (who runs, how many prompt tokens, which k), the runner executes the plan
(draft, verify, accept, keep its caches right), the scheduler turns the result into per-request
outputs. A server thread may add requests and cancellations at any time; ``step`` runs on one thread.
"""

from __future__ import annotations

from trispec.request import GenerationRequest
from trispec.runners.base import SpecRunner
from trispec.scheduler import RequestOutput, Scheduler
from trispec.stats import EngineStats
from trispec.step import KVUsage, PrefixCacheReset


class LLMEngine:
    def __init__(self, scheduler: Scheduler, runner: SpecRunner) -> None:
        self.scheduler = scheduler
        self.runner = runner

    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        result = self.runner.run(plan)
        return self.scheduler.postprocess(plan, result)

    # -- requests (any thread) ------------------------------------------------------------------
    def add_request(self, request: GenerationRequest, tokenize_later: bool = False) -> int:
        """Validate and queue; raises ``InvalidInputError`` naming the field (``tokenize_later``: see
        ``Scheduler.add_request``)."""
        return self.scheduler.add_request(request, tokenize_later)

    def compile_guide(self, request: GenerationRequest) -> None:
        """Compile a guided request's grammar into the cache now (on the caller's thread); raises
        ``InvalidInputError`` for a bad guide. ``add_request`` then finds it compiled."""
        self.scheduler.compile_guide(request)

    def cancel(self, request_id: int) -> None:
        self.scheduler.cancel(request_id)

    def admit_urgently_after(self, seconds: float | None) -> None:
        """Serving under overload: a request waiting this long preempts one that has run as long
        (None: requests wait their turn, as offline)."""
        self.scheduler.urgent_after_s = seconds

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def queued_request_ids(self) -> list[int]:
        """Requests waiting for a slot in the running batch (or not yet seen by a step), oldest first."""
        return self.scheduler.queued_ids()

    def passed_over_request_ids(self) -> list[int]:
        """Queued requests a step has seen and could not admit (the batch or the KV pool is full):
        the ones ``scheduler.max_queue_delay_s`` refuses."""
        return self.scheduler.passed_over_ids()

    # -- state for metrics ----------------------------------------------------------------------
    @property
    def stats(self) -> EngineStats:
        return self.scheduler.stats

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def kv_usage(self) -> dict[str, KVUsage]:
        return self.runner.kv_usage()

    # -- an operator's reset (the thread that steps, between two steps) -------------------------
    def reset_prefix_cache(self) -> dict[str, PrefixCacheReset]:
        """Empty every KV pool's prefix cache; running requests go on, their text unchanged."""
        return self.runner.reset_prefix_cache()
