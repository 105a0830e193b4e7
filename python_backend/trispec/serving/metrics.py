"""Prometheus metrics on Triton's own metrics port, through the Python backend's ``MetricFamily``.

The loop reports cumulative engine totals after every round; counters are advanced by the change
since the previous report, gauges are set, and the round latency, each request's time to first token
and each finished request's mean inter-token latency are observed in histograms.
deploy/grafana/specdec.json charts them (tests/test_deploy_dashboard.py checks its queries against
``exported_metric_names()``).
"""

from __future__ import annotations

import copy
from types import ModuleType
from typing import Any

from trispec.serving.loop import RoundReport
from trispec.stats import EngineStats
from trispec.step import KVUsage

ROUND_LATENCY_BUCKETS = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
VERIFY_BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64]
TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
INTER_TOKEN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28]


class TritonMetrics:
    """Implements ``LoopMetrics`` with ``pb_utils.MetricFamily`` (pass the pb_utils module)."""

    def __init__(self, pb_utils: ModuleType, model: str) -> None:
        family = pb_utils.MetricFamily
        self._family = family
        self._labels = {"model": model}
        self._families: dict[str, Any] = {}

        def metric(name: str, kind: Any, description: str, **labels: str) -> Any:
            if name not in self._families:
                self._families[name] = family(name=name, description=description, kind=kind)
            return self._families[name].Metric(labels={**self._labels, **labels})

        def histogram(name: str, description: str, buckets: list[float]) -> Any:
            self._families[name] = family(name=name, description=description, kind=family.HISTOGRAM)
            return self._families[name].Metric(labels=self._labels, buckets=buckets)

        self._metric = metric
        counter, gauge = family.COUNTER, family.GAUGE
        self.generated_tokens = metric("specdec_generated_tokens_total", counter, "Tokens sent to clients")
        self.drafts = metric("specdec_drafts_total", counter, "Verify rounds that checked draft tokens")
        self.draft_tokens = metric("specdec_draft_tokens_total", counter, "Draft tokens proposed")
        self.accepted_tokens = metric("specdec_accepted_tokens_total", counter, "Draft tokens accepted")
        self.verify_rounds = metric("specdec_verify_rounds_total", counter, "Per-sequence verify rounds")
        self.verify_steps = metric("specdec_verify_steps_total", counter, "Batched target verify passes")
        self.running = metric("specdec_running_sequences", gauge, "Sequences in the running batch")
        self.waiting = metric("specdec_waiting_sequences", gauge, "Sequences waiting for admission")
        self.max_verify_batch = metric(
            "specdec_max_verify_batch_size", gauge, "Most sequences that shared one verify pass so far"
        )
        self.round_latency = histogram(
            "specdec_round_latency_seconds", "Wall time of one loop round", ROUND_LATENCY_BUCKETS
        )
        self.verify_batch = histogram(
            "specdec_verify_batch_size", "Sequences per batched verify pass", VERIFY_BATCH_BUCKETS
        )
        self.ttft = histogram(
            "specdec_time_to_first_token_seconds",
            "Per sequence: request arrival to its first verified token",
            TTFT_BUCKETS,
        )
        self.inter_token = histogram(
            "specdec_inter_token_latency_seconds",
            "Per finished sequence of 2+ tokens: (last token - first token) / (tokens - 1)",
            INTER_TOKEN_BUCKETS,
        )
        self.planned_draft_tokens = metric(
            "specdec_planned_draft_tokens_total",
            counter,
            "Draft tokens planned per verify round (the k chosen), summed; / verify rounds = mean k",
        )
        kv_states = {
            "used": "KV-cache blocks held by running sequences",
            "free": "KV-cache blocks empty",
            "cached": "KV-cache blocks no sequence holds, kept by the prefix cache (evicted on demand)",
        }
        self._kv = {
            (pool, state): metric(f"specdec_kv_blocks_{state}", gauge, description, pool=pool)
            for pool in ("target", "drafter")
            for state, description in kv_states.items()
        }
        prefix_counters = {
            "queried_tokens": (
                "specdec_prefix_cache_queried_tokens_total",
                "Tokens sequences lacked when they looked the prefix cache up (a prompt at admission; a "
                "draft cache catching up)",
            ),
            "hit_tokens": (
                "specdec_prefix_cache_hit_tokens_total",
                "Of the tokens looked up, those found in the prefix cache (not computed again)",
            ),
            "evicted_blocks": (
                "specdec_prefix_cache_evicted_blocks_total",
                "Cached KV blocks evicted (least recently used) to hold new tokens",
            ),
        }
        self._prefix = {
            (pool, field): metric(name, counter, description, pool=pool)
            for pool in ("target", "drafter")
            for field, (name, description) in prefix_counters.items()
        }
        self._last_kv: dict[str, KVUsage] = {}
        self.cached_prompt_tokens = metric(
            "specdec_prompt_cached_tokens_total",
            counter,
            "Prompt tokens of admitted requests the target's prefix cache held (OpenAI's cached_tokens)",
        )
        self.prompt_tokens = metric(
            "specdec_prompt_tokens_total", counter, "Prompt tokens of admitted requests"
        )
        self._counters: dict[tuple[str, str], Any] = {}
        self.draft_failures = metric(
            "specdec_draft_failures_total", counter, "Steps whose drafter failed (run as plain decoding)"
        )
        self.preemptions = metric(
            "specdec_preemptions_total",
            counter,
            "Sequences whose KV was freed to make room (they resume later, recomputing their tokens)",
        )
        self.resumed_streams = metric(
            "specdec_resumed_streams_total",
            counter,
            "Requests resuming a stream the server cut (they carried skip_output_tokens)",
        )
        # the prefix-cache counters above are totals since start and never go back (a reset empties the
        # cache, not the history: rate() over them stays right); this says when an operator emptied it
        self.prefix_cache_resets = metric(
            "specdec_prefix_cache_resets_total",
            counter,
            "Times an operator emptied the prefix cache (reset_prefix_cache, every pool at once)",
        )
        self._accepted_at: list[Any] = []
        self._drafted_at: list[Any] = []
        self._planned: list[Any] = []
        self._last = EngineStats()  # the totals at the previous report

    def _counter(self, name: str, description: str, label: str, value: str) -> Any:
        """The counter ``name{label=value}``, made on first use (label values come as they occur)."""
        key = (name, value)
        if key not in self._counters:
            self._counters[key] = self._metric(name, self._family.COUNTER, description, **{label: value})
        return self._counters[key]

    def record_rejection(self, reason: str) -> None:
        description = "Requests refused before generation, by reason"
        self._counter("specdec_requests_rejected_total", description, "reason", reason).increment(1)

    def record_resumed(self) -> None:
        self.resumed_streams.increment(1)

    def record_prefix_cache_reset(self) -> None:
        self.prefix_cache_resets.increment(1)

    def record_model(self, fingerprint: str, numerics: str) -> None:
        """``specdec_model_info{fingerprint, numerics} 1``: which model this replica serves (two
        replicas with different fingerprints do not resume each other's streams)."""
        info = self._metric(
            "specdec_model_info",
            self._family.GAUGE,
            "The model this replica serves: its fingerprint and numerics path (value always 1)",
            fingerprint=fingerprint,
            numerics=numerics,
        )
        info.set(1)

    def _accepted_position(self, position: int) -> Any:
        while len(self._accepted_at) <= position:
            self._accepted_at.append(
                self._metric(
                    "specdec_accepted_per_position_total",
                    self._family.COUNTER,
                    "Rounds in which draft position i (0-based) was accepted",
                    position=str(len(self._accepted_at)),
                )
            )
        return self._accepted_at[position]

    def _drafted_position(self, position: int) -> Any:
        while len(self._drafted_at) <= position:
            self._drafted_at.append(
                self._metric(
                    "specdec_drafted_per_position_total",
                    self._family.COUNTER,
                    "Rounds that proposed a draft token at position i (0-based)",
                    position=str(len(self._drafted_at)),
                )
            )
        return self._drafted_at[position]

    def _planned_rounds(self, k: int) -> Any:
        while len(self._planned) <= k:
            self._planned.append(
                self._metric(
                    "specdec_rounds_by_num_draft_tokens_total",
                    self._family.COUNTER,
                    "Per-sequence verify rounds by the number of draft tokens planned (adaptive k)",
                    num_draft_tokens=str(len(self._planned)),
                )
            )
        return self._planned[k]

    def record(self, report: RoundReport) -> None:
        totals = copy.deepcopy(report.engine)
        last, self._last = self._last, totals
        # counter ← the EngineStats field it follows
        for counter, name in (
            (self.generated_tokens, "generated_tokens"),
            (self.drafts, "drafts"),
            (self.draft_tokens, "draft_tokens"),
            (self.accepted_tokens, "accepted_tokens"),
            (self.verify_rounds, "rounds"),
            (self.draft_failures, "draft_failures"),
            (self.preemptions, "preemptions"),
            (self.prompt_tokens, "prompt_tokens"),
            (self.cached_prompt_tokens, "cached_prompt_tokens"),
        ):
            delta = getattr(totals, name) - getattr(last, name)
            if delta:
                counter.increment(delta)
        new_steps = totals.verify_batches - last.verify_batches
        if new_steps:
            self.verify_steps.increment(new_steps)
            # one round has at most one verify pass: observe its mean batch
            sequences = totals.verify_batch_sequences - last.verify_batch_sequences
            self.verify_batch.observe(sequences / new_steps)
        for position, count in enumerate(totals.accepted_per_position):
            before = last.accepted_per_position[position] if position < len(last.accepted_per_position) else 0
            if count > before:
                self._accepted_position(position).increment(count - before)
        for position, count in enumerate(totals.drafted_per_position):
            before = last.drafted_per_position[position] if position < len(last.drafted_per_position) else 0
            if count > before:
                self._drafted_position(position).increment(count - before)
        planned = 0
        for k, count in enumerate(totals.rounds_by_num_draft_tokens):
            before = last.rounds_by_num_draft_tokens[k] if k < len(last.rounds_by_num_draft_tokens) else 0
            if count > before:
                self._planned_rounds(k).increment(count - before)
                planned += k * (count - before)
        if planned:
            self.planned_draft_tokens.increment(planned)
        for reason in report.finished:
            counter = self._counter("specdec_requests_total", "Finished requests", "finish_reason", reason)
            counter.increment(1)
        self.running.set(report.running)
        self.waiting.set(report.waiting)
        self.max_verify_batch.set(report.engine.max_verify_batch)
        if report.latency_s is not None:
            self.round_latency.observe(report.latency_s)
        for seconds in report.ttft_s:
            self.ttft.observe(seconds)
        for seconds in report.inter_token_s:
            self.inter_token.observe(seconds)
        for pool, usage in report.kv.items():
            self._set_kv(pool, usage)

    def _set_kv(self, pool: str, usage: KVUsage) -> None:
        self._kv[(pool, "used")].set(usage.used_blocks)
        self._kv[(pool, "free")].set(usage.empty_blocks)
        self._kv[(pool, "cached")].set(usage.cached_blocks)
        last = self._last_kv.get(pool)
        for field in ("queried_tokens", "hit_tokens", "evicted_blocks"):
            delta = getattr(usage, field) - (getattr(last, field) if last is not None else 0)
            if delta > 0:
                self._prefix[(pool, field)].increment(delta)
        self._last_kv[pool] = usage


def exported_metric_names() -> dict[str, str]:
    """Every family ``TritonMetrics`` exports, name → kind (``counter``, ``gauge``, ``histogram``), read
    from the class itself: it is driven through one report of each kind with a stand-in
    ``MetricFamily`` that keeps what is made, so families made on first use (refusal reasons, draft
    positions, k values, finish reasons) are there too."""
    made: dict[str, str] = {}

    class _Metric:
        def increment(self, delta: float) -> None: ...

        def set(self, value: float) -> None: ...

        def observe(self, value: float) -> None: ...

    class _Family:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

        def __init__(self, name: str, description: str, kind: str) -> None:
            made[name] = kind

        def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> _Metric:
            return _Metric()

    pb = ModuleType("pb_utils_names")
    pb.MetricFamily = _Family  # type: ignore[attr-defined]
    metrics = TritonMetrics(pb, "specdec")
    totals = EngineStats()
    totals.record_round(2, 1, 2)
    totals.draft_failures = totals.preemptions = 1
    kv = {"target": KVUsage(10, 1, 16), "drafter": KVUsage(10, 1, 16)}
    metrics.record(RoundReport(0.01, 1, 0, kv, totals, ["length"], ttft_s=[0.1], inter_token_s=[0.01]))
    metrics.record_rejection("queue_full")
    metrics.record_model("0123456789abcdef", "cpu avx512")
    return made
