"""TritonMetrics turns cumulative engine totals into counter increments, gauges and histograms.

``pb_utils`` exists only inside Triton's Python stub, so this feeds it a stand-in MetricFamily that
keeps the values; the end-to-end tests read the real ones from the metrics port.
"""

from __future__ import annotations

import types
from typing import ClassVar

from trispec.engine.base import KVUsage
from trispec.serving.loop import RoundReport
from trispec.serving.metrics import TritonMetrics
from trispec.stats import EngineStats


class _Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value = 0.0
        self.observed: list[float] = []

    def increment(self, delta: float) -> None:
        assert delta > 0, "counters only go up"
        self.value += delta

    def set(self, value: float) -> None:
        self.value = value

    def observe(self, value: float) -> None:
        self.observed.append(value)


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: ClassVar[dict[str, list[_Metric]]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        _Family.made.setdefault(name, [])

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> _Metric:
        metric = _Metric(labels)
        _Family.made[self.name].append(metric)
        return metric


def value(name: str, **labels: str) -> float:
    return sum(m.value for m in _Family.made[name] if labels.items() <= m.labels.items())


def report(engine: EngineStats, finished: list[str], used: int) -> RoundReport:
    return RoundReport(0.05, 2, 1, {"target": KVUsage(100, used, 16)}, engine, finished)


def test_counters_follow_the_totals_and_gauges_the_state() -> None:
    _Family.made = {}
    metrics = TritonMetrics(types.SimpleNamespace(MetricFamily=_Family), "specdec")  # type: ignore[arg-type]
    engine = EngineStats()
    engine.record_round(4, 3)
    engine.record_verify_batch(1)
    engine.generated_tokens = 4
    metrics.record(report(engine, [], used=10))
    engine.record_round(4, 1)
    engine.record_round(0, 0)
    engine.record_verify_batch(2)
    engine.generated_tokens = 7
    engine.preemptions = 2
    metrics.record(report(engine, ["length", "cancelled"], used=3))

    assert value("specdec_generated_tokens_total") == 7
    assert value("specdec_draft_tokens_total") == 8
    assert value("specdec_accepted_tokens_total") == 4
    assert value("specdec_drafts_total") == 2  # the k=0 round proposed nothing
    assert value("specdec_verify_rounds_total") == 3
    assert value("specdec_verify_steps_total") == 2
    assert value("specdec_preemptions_total") == 2
    assert value("specdec_max_verify_batch_size") == 2
    assert [value("specdec_accepted_per_position_total", position=str(i)) for i in range(3)] == [2, 1, 1]
    planned = "specdec_rounds_by_num_draft_tokens_total"
    assert [value(planned, num_draft_tokens=str(k)) for k in (0, 4)] == [1, 2]
    assert value("specdec_requests_total", finish_reason="cancelled") == 1
    assert value("specdec_kv_blocks_used", pool="target") == 3
    assert value("specdec_kv_blocks_free", pool="target") == 97  # nothing cached: the rest is empty
    assert value("specdec_running_sequences") == 2 and value("specdec_waiting_sequences") == 1
    (batch,) = _Family.made["specdec_verify_batch_size"]
    assert batch.observed == [1.0, 2.0]


def test_latencies_draft_positions_and_planned_k() -> None:
    """TTFT and inter-token latency are observed as the loop reports them; drafted-per-position and the
    planned draft tokens (k chosen, summed) follow the totals, so acceptance per position and mean k
    are ratios of counters on the dashboard."""
    _Family.made = {}
    metrics = TritonMetrics(types.SimpleNamespace(MetricFamily=_Family), "specdec")  # type: ignore[arg-type]
    engine = EngineStats()
    engine.record_round(4, 3)
    engine.record_round(2, 0, 4)  # planned 4, the drafter proposed 2
    kv = {"target": KVUsage(100, 1, 16)}
    metrics.record(RoundReport(0.05, 1, 0, kv, engine, [], ttft_s=[0.2, 0.3], inter_token_s=[]))
    engine.record_round(0, 0, 0)
    metrics.record(RoundReport(0.05, 1, 0, kv, engine, ["length"], ttft_s=[], inter_token_s=[0.02]))

    (ttft,) = _Family.made["specdec_time_to_first_token_seconds"]
    (inter_token,) = _Family.made["specdec_inter_token_latency_seconds"]
    assert ttft.observed == [0.2, 0.3] and inter_token.observed == [0.02]
    drafted = [value("specdec_drafted_per_position_total", position=str(i)) for i in range(4)]
    assert drafted == [2, 2, 1, 1]
    assert value("specdec_planned_draft_tokens_total") == 8  # 4 + 4 + 0: mean k over 3 rounds 8/3


def test_prefix_cache_counters_per_pool() -> None:
    """Per pool: cached blocks as a gauge beside used and empty ones (the three add up to the pool);
    tokens looked up and found, and evictions, as counters following the pool's totals; the prompt
    tokens taken from the target's cache follow the engine's."""
    _Family.made = {}
    metrics = TritonMetrics(types.SimpleNamespace(MetricFamily=_Family), "specdec")  # type: ignore[arg-type]
    engine = EngineStats()
    first = {"target": KVUsage(100, 10, 16, 20, 300, 128, 0), "drafter": KVUsage(50, 5, 16, 8, 40, 16, 2)}
    engine.prompt_tokens, engine.cached_prompt_tokens = 300, 128
    metrics.record(RoundReport(0.05, 1, 0, first, engine, []))
    later = {"target": KVUsage(100, 30, 16, 5, 500, 160, 3), "drafter": KVUsage(50, 5, 16, 8, 40, 16, 2)}
    engine.prompt_tokens, engine.cached_prompt_tokens = 500, 160
    metrics.record(RoundReport(0.05, 1, 0, later, engine, []))
    used, free, cached = (value(f"specdec_kv_blocks_{s}", pool="target") for s in ("used", "free", "cached"))
    assert (used, free, cached) == (30, 65, 5) and used + free + cached == 100
    assert value("specdec_prefix_cache_queried_tokens_total", pool="target") == 500
    assert value("specdec_prefix_cache_hit_tokens_total", pool="target") == 160
    assert value("specdec_prefix_cache_evicted_blocks_total", pool="target") == 3
    assert value("specdec_prefix_cache_hit_tokens_total", pool="drafter") == 16
    assert value("specdec_prefix_cache_evicted_blocks_total", pool="drafter") == 2
    assert value("specdec_prompt_tokens_total") == 500 and value("specdec_prompt_cached_tokens_total") == 160
