"""Phase ``memory`` (throughout the run): the Python stub's RSS, sampled every second, must not grow
after the first minute."""

from __future__ import annotations

from trispec_client.soak.context import Settings
from trispec_client.soak.report import Report
from trispec_client.soak.target import RssSampler


def memory_checks(sampler: RssSampler | None, report: Report, s: Settings, elapsed_s: float) -> None:
    if sampler is None:
        report.check("memory", "stub RSS flat after the first minute", None, "skipped: no local stub found")
        return
    samples = sampler.samples
    base = sampler.at(s.rss_baseline_s)
    if not samples or base is None or elapsed_s < s.memory_min_run_s:
        report.check("memory", "stub RSS flat", None, f"skipped: run too short ({elapsed_s:.0f} s)")
        return
    end = samples[-1][1]
    peak = max(rss for _, rss in samples)
    growth = (end - base) / base
    report.figures["memory"] = {
        "stub_pid": sampler.pid,
        "rss_start_mb": round(samples[0][1] / 2**20, 1),
        "rss_baseline_mb": round(base / 2**20, 1),
        "baseline_at_s": s.rss_baseline_s,
        "rss_end_mb": round(end / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "growth_after_baseline": round(growth, 4),
        "samples": len(samples),
        "run_s": round(elapsed_s, 1),
        "stub_lost": sampler.lost,
    }
    report.check("memory", "stub stayed up (same process)", not sampler.lost, f"pid {sampler.pid}")
    report.check(
        "memory",
        f"stub RSS growth after {s.rss_baseline_s:g} s",
        growth <= s.max_rss_growth,
        f"{base / 2**20:.0f} MB -> {end / 2**20:.0f} MB ({growth:+.1%}), peak {peak / 2**20:.0f} MB",
        f"<= {s.max_rss_growth:+.0%}",
    )
