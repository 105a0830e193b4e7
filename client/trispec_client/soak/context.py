"""The settings of a run and what every phase shares: the report, the server, a client, the idle checks."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from trispec_client.client import SpecDecClient
from trispec_client.soak.report import Outcome, Report
from trispec_client.soak.target import Server


@dataclass
class Settings:
    url: str
    protocol: str
    http_url: str
    metrics_url: str
    streams: int
    mixed_duration_s: float
    mixed_requests: int
    greedy_checks: int
    cancel_streams: int
    burst: int
    burst_max_tokens: int
    small_after_s: float
    max_refusal_s: float
    max_small_ttft_s: float
    request_timeout_s: float
    idle_timeout_s: float
    oversized_mb: float
    max_oversized_s: float
    max_stream_gap_s: float
    rss_baseline_s: float
    max_rss_growth: float
    memory_min_run_s: float
    seed: int
    fault_streams: int = 8
    fault_max_tokens: int = 64
    resume_timeout_s: float = 120.0
    # phase failover: the second replica, and when the first is killed (every stream under way, the
    # furthest with this many tokens)
    replica_url: str | None = None
    replica_http_url: str | None = None
    replica_metrics_url: str | None = None
    failover_kill_after_tokens: int = 1


class Soak:
    """What every phase works with: the settings, the report, the server and a client."""

    def __init__(self, settings: Settings, report: Report, log: Callable[[str], None]) -> None:
        self.s = settings
        self.report = report
        self.log = log
        self.rng = random.Random(settings.seed)
        self.server = Server(settings.http_url, settings.metrics_url)
        # retries=0, no resume: a refusal or a cut stream is an outcome the soak counts, not something
        # to hide (the fault phase makes its own resuming clients)
        self.client = SpecDecClient(
            settings.url,
            protocol=settings.protocol,
            timeout_s=settings.request_timeout_s,
            retries=0,
            resume=False,
        )
        self.idle_free = self.server.kv_state()[1]
        # requests already run alone (the fault phase's rounds send the same ones): repr key -> outcome
        self.alone: dict[str, Outcome] = {}

    def worker_client(self) -> SpecDecClient:
        # HTTP: a pool per worker keeps connections apart; gRPC opens a stream per request anyway
        if self.s.protocol == "http":
            return SpecDecClient(
                self.s.url, protocol="http", timeout_s=self.s.request_timeout_s, retries=0, resume=False
            )
        return self.client

    def idle_checks(self, phase: str) -> None:
        ok, state, waited = self.server.wait_idle(self.idle_free, self.s.idle_timeout_s)
        used, free, running, waiting = state or (math.nan,) * 4
        self.report.check(
            phase,
            "KV blocks back to idle",
            ok,
            f"used {used:g}, free or cached {free:g} (idle {self.idle_free:g}), running {running:g}, "
            f"waiting {waiting:g} after {waited:.1f} s",
            f"within {self.s.idle_timeout_s:g} s",
        )
        self.report.check(
            phase, "server ready after", self.server.ready(), "ready" if self.server.ready() else "NOT ready"
        )
