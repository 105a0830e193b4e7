"""The figures of ``specdec-bench-served``: per arm, workload and client count, from its timed runs;
and the ratios between arms measured in the same run.

Per arm: ``tok_s`` (aggregate: every token over the runs' wall time, first-token times included: what
the issue's tables compare), ``decode_tok_s`` (one stream's decode: the tokens after each request's
first over the time from its first token to its last, pooled over requests) and ``ms_per_token`` (its
inverse), ``ttft_p50_s`` (median time to first token), ``tok_s_runs`` (each repeat's aggregate: the
noise a ratio is read against). Ratios: ours (the config's defaults, and plain) against llama-server
plain, and against our own plain; llama-server ``-md`` against its plain; served against offline on
one stream's decode, and the serving overhead per token in ms (served ms a token - offline ms a token).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from trispec.bench.served_loop import ArmRun

OURS_SPEC = "ours"  # the config's defaults: its drafter, k, adaptive speculation
OURS_PLAIN = "ours plain"  # num_draft_tokens: 0
PEER_PLAIN = "llama-server"
PEER_DRAFT = "llama-server -md"
OFFLINE_SPEC = "offline"  # SpeculativeLLM in the bench's process, the same config
OFFLINE_PLAIN = "offline plain"
ALL = "all"  # the workloads pooled

# (name, numerator arm, denominator arm, figure)
RATIOS = (
    ("ours_vs_llama_server", OURS_SPEC, PEER_PLAIN, "tok_s"),
    ("ours_plain_vs_llama_server", OURS_PLAIN, PEER_PLAIN, "tok_s"),
    ("ours_vs_ours_plain", OURS_SPEC, OURS_PLAIN, "tok_s"),
    ("llama_server_md_vs_plain", PEER_DRAFT, PEER_PLAIN, "tok_s"),
    ("served_vs_offline", OURS_SPEC, OFFLINE_SPEC, "decode_tok_s"),
    ("served_vs_offline_plain", OURS_PLAIN, OFFLINE_PLAIN, "decode_tok_s"),
)
# (name, served arm, offline arm): served ms a token - offline ms a token
OVERHEADS = (
    ("overhead_ms", OURS_SPEC, OFFLINE_SPEC),
    ("overhead_ms_plain", OURS_PLAIN, OFFLINE_PLAIN),
)


def combined(runs: Sequence[ArmRun]) -> ArmRun:
    """Several runs as one: times and tokens summed, first-token times pooled."""
    return ArmRun(
        elapsed_s=sum(r.elapsed_s for r in runs),
        ttft_s=tuple(t for r in runs for t in r.ttft_s),
        decode_tokens=sum(r.decode_tokens for r in runs),
        decode_s=sum(r.decode_s for r in runs),
        tokens=sum(r.tokens for r in runs),
    )


def arm_row(workload: str, clients: int, arm: str, runs: Sequence[ArmRun]) -> dict[str, Any]:
    """One arm at one workload and client count, its repeats pooled."""
    if not runs:
        raise ValueError(f"{arm}: no runs")
    pooled = combined(runs)
    if pooled.decode_tokens < 1 or pooled.decode_s <= 0:
        raise ValueError(f"{arm}: no decode time (max_tokens must be >= 2)")
    return {
        "row": "served",
        "workload": workload,
        "clients": clients,
        "arm": arm,
        "requests": len(pooled.ttft_s),
        "tokens": pooled.tokens,
        "seconds": round(pooled.elapsed_s, 4),
        "tok_s": round(pooled.tok_s, 3),
        "tok_s_runs": [round(r.tok_s, 3) for r in runs],
        "decode_tok_s": round(pooled.decode_tokens / pooled.decode_s, 3),
        "ms_per_token": round(1000 * pooled.decode_s / pooled.decode_tokens, 3),
        "ttft_p50_s": round(statistics.median(pooled.ttft_s), 4),
    }


def pooled_runs(per_workload: Sequence[Sequence[ArmRun]]) -> list[ArmRun]:
    """One arm's runs over several workloads as the ``all`` workload's: repeat r of each combined."""
    repeats = min(len(runs) for runs in per_workload)
    return [combined([runs[r] for runs in per_workload]) for r in range(repeats)]


def arm_rows(
    runs: Mapping[tuple[str, int, str], Sequence[ArmRun]], workloads: Sequence[str], clients: Sequence[int]
) -> list[dict[str, Any]]:
    """A row per (workload, client count, arm) of ``runs`` (keyed so), and the ``all`` workload's where
    an arm ran several workloads."""
    rows = []
    order = (OURS_SPEC, OURS_PLAIN, PEER_PLAIN, PEER_DRAFT, OFFLINE_SPEC, OFFLINE_PLAIN)
    for n in clients:
        for arm in order:
            ran = [w for w in workloads if (w, n, arm) in runs]
            rows += [arm_row(w, n, arm, runs[(w, n, arm)]) for w in ran]
            if len(ran) > 1:
                rows.append(arm_row(ALL, n, arm, pooled_runs([runs[(w, n, arm)] for w in ran])))
    return rows


def ratio_row(rows: Sequence[dict[str, Any]], workload: str, clients: int) -> dict[str, Any]:
    """The ratios between the arms of one workload and client count (None where an arm did not run)."""
    by_arm = {r["arm"]: r for r in rows if r["workload"] == workload and r["clients"] == clients}
    out: dict[str, Any] = {"row": "served_ratios", "workload": workload, "clients": clients}
    for name, top, bottom, figure in RATIOS:
        a, b = by_arm.get(top), by_arm.get(bottom)
        out[name] = round(a[figure] / b[figure], 4) if a and b else None
    for name, served, offline in OVERHEADS:
        a, b = by_arm.get(served), by_arm.get(offline)
        out[name] = round(a["ms_per_token"] - b["ms_per_token"], 3) if a and b else None
    return out
