"""Results as rows: one per arm, workload and concurrency (``row``), and workload ``all`` over them
(``combined_rows``)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from trispec.bench.arms import PLAIN, Arm
from trispec.bench.closed_loop import LoopResult
from trispec.bench.memory import host_ms_per_token


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in ps}
    return {f"p{p}": float(np.percentile(values, p)) for p in ps}


def row(workload: str, concurrency: int, arm: Arm, result: LoopResult, plain: dict[str, Any] | None) -> dict:
    stats = result.stats
    drafted, accepted = stats.drafted_per_position, stats.accepted_per_position
    per_position = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    speedup = result.tok_s / plain["tok_s"] if plain else None
    identical = None
    if plain and arm.name != PLAIN:
        identical = result.token_ids == plain["token_ids"] and result.repeats_agree
    return {
        "workload": workload,
        "concurrency": concurrency,
        "arm": arm.name,
        "drafter": arm.drafter,
        "k": arm.k,
        "adaptive": arm.adaptive,
        "requests": len(result.token_ids) * result.repeats,
        "tokens": result.num_tokens,
        "seconds": round(result.elapsed_s, 4),
        "tok_s": round(result.tok_s, 3),
        "tok_s_runs": [round(t, 3) for t in result.tok_s_runs],
        "speedup_vs_plain": round(speedup, 4) if speedup is not None else None,
        "acceptance": round(stats.acceptance_rate, 4) if arm.drafter else None,
        "accepted_per_position": [round(p, 4) for p in per_position],
        "mean_accepted_length": round(stats.mean_accepted_length, 4),
        "rounds": stats.rounds,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "mean_k": round(stats.mean_num_draft_tokens, 3),
        "draft_time_share": round(stats.draft_time_s / result.elapsed_s, 4),
        "ttft_s": {p: _round(v) for p, v in percentiles(result.ttft_s).items()},
        "itl_s": {p: _round(v) for p, v in percentiles(result.itl_s).items()},
        # tokens after the first over the time after it (every request makes the same number of tokens)
        "decode_tok_s": round(1 / statistics.fmean(result.itl_s), 3) if result.itl_s else None,
        "identical_to_plain": identical,
        # plain at one request: a token's time through the scheduler less its kernels' (memory rows)
        "host": host_ms_per_token(result.itl_s, result.kernel_forwards)
        if arm.name == PLAIN and concurrency == 1
        else None,
        "token_ids": result.token_ids,  # dropped from the printed rows
    }


def combined_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Workload ``all``: each arm and concurrency over every workload together (tokens over seconds
    summed), the mix a server sees; latency percentiles stay per workload."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["acceptance"] is not None or r["arm"] == PLAIN:  # not the Hugging Face reference rows
            groups.setdefault((r["concurrency"], r["arm"]), []).append(r)
    plain_tok_s: dict[int, float] = {}
    for (concurrency, arm), group in groups.items():
        tokens, seconds = sum(r["tokens"] for r in group), sum(r["seconds"] for r in group)
        first = group[0]
        drafted, accepted = sum(r["draft_tokens"] for r in group), sum(r["accepted_tokens"] for r in group)
        rounds = sum(r["rounds"] for r in group)
        identical = [r["identical_to_plain"] for r in group]
        combined = {
            **{k: first[k] for k in ("concurrency", "arm", "drafter", "k", "adaptive")},
            "workload": "all",
            "requests": sum(r["requests"] for r in group),
            "tokens": tokens,
            "seconds": round(seconds, 4),
            "tok_s": round(tokens / seconds, 3),
            "tok_s_runs": _combined_runs(group),
            "speedup_vs_plain": None,
            "acceptance": None if first["acceptance"] is None else round(accepted / max(drafted, 1), 4),
            "mean_k": round(sum(r["mean_k"] * r["rounds"] for r in group) / max(rounds, 1), 3),
            "rounds": rounds,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "identical_to_plain": None if arm == PLAIN else all(identical),
            "workloads": [r["workload"] for r in group],
        }
        if arm == PLAIN:
            plain_tok_s[concurrency] = combined["tok_s"]
        out.append(combined)
    for r in out:
        if r["arm"] != PLAIN and r["concurrency"] in plain_tok_s:
            r["speedup_vs_plain"] = round(r["tok_s"] / plain_tok_s[r["concurrency"]], 4)
    return out


def _combined_runs(group: list[dict[str, Any]]) -> list[float]:
    """Repeat j over every workload: its tokens over its seconds (repeats ran in the same order)."""
    runs = [r["tok_s_runs"] for r in group]
    if len({len(t) for t in runs}) != 1:
        return []
    per_run = [r["tokens"] / len(r["tok_s_runs"]) for r in group]
    return [
        round(sum(per_run) / sum(n / t[j] for n, t in zip(per_run, runs)), 3) for j in range(len(runs[0]))
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)
