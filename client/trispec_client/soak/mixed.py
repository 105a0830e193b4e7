"""Phase ``mixed``: N concurrent streams of mixed prompts, max_tokens, greedy/sampled and k; every
stream must end with a final response, and each greedy one must equal the same request run alone."""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import PROMPTS, count, pct, run_stream


def run(ctx: Soak) -> None:
    s = ctx.s
    deadline = time.monotonic() + s.mixed_duration_s
    lock = threading.Lock()
    outcomes: list[tuple[dict[str, Any], Outcome]] = []
    counter = iter(range(s.mixed_requests))

    def params(rng: random.Random) -> dict[str, Any]:
        p: dict[str, Any] = {
            "max_tokens": rng.choice([8, 16, 32, 64]),
            "num_draft_tokens": rng.choice([0, 1, 2, 4, 8]),
            "prompt": rng.choice(PROMPTS),
        }
        if rng.random() < 0.4:
            p.update(temperature=rng.choice([0.7, 1.0]), seed=rng.randrange(1 << 16))
        return p

    def worker(i: int) -> None:
        rng = random.Random(s.seed * 1000 + i)
        client = ctx.worker_client()
        while time.monotonic() < deadline:
            with lock:
                if next(counter, None) is None:
                    return
            p = params(rng)
            prompt = p.pop("prompt")
            out = run_stream(client, prompt, s.request_timeout_s, **p)
            with lock:
                outcomes.append(({"prompt": prompt, **p}, out))

    start = time.monotonic()
    with ThreadPoolExecutor(s.streams) as pool:
        list(pool.map(worker, range(s.streams)))
    elapsed = time.monotonic() - start
    kinds = count(out.kind for _, out in outcomes)
    tokens = sum(out.tokens for _, out in outcomes)
    ttfts = [out.ttft_s for _, out in outcomes if out.ttft_s is not None]
    ctx.report.figures["mixed"] = {
        "requests": len(outcomes),
        "outcomes": kinds,
        "elapsed_s": round(elapsed, 1),
        "tokens_per_s": round(tokens / elapsed, 1) if elapsed else 0.0,
        "ttft_p50_s": round(pct(ttfts, 0.5), 3),
        "ttft_max_s": round(max(ttfts, default=math.nan), 3),
    }
    ctx.log(f"mixed: {len(outcomes)} requests in {elapsed:.0f} s, {kinds}")
    # more streams than the batch holds: the server may refuse some (retryable, by design)
    refused = sum(o.kind == "refused" for _, o in outcomes)
    ended = [(p, o) for p, o in outcomes if o.kind != "refused"]
    bad = [(p, o) for p, o in ended if o.kind != "completed" or not o.finish_reason]
    ctx.report.check(
        "mixed",
        f"{s.streams} concurrent streams end with a final response (or a retryable refusal)",
        bool(outcomes) and not bad and refused < len(outcomes),
        f"{len(outcomes) - len(bad)}/{len(outcomes)} ok, {refused} refused"
        + (f"; first bad: {bad[0][1].kind} {bad[0][1].message[:80]!r}" if bad else ""),
        "all",
    )
    # greedy output is the target's own, whatever shared the batch: equal to the request alone
    greedy: dict[tuple[str, int, int], str] = {}
    for p, o in outcomes:
        if "temperature" not in p and o.kind == "completed":
            greedy.setdefault((p["prompt"], p["max_tokens"], p["num_draft_tokens"]), o.text)
    keys = sorted(greedy)[: s.greedy_checks]
    mismatches = []
    for prompt, max_tokens, k in keys:
        alone = run_stream(ctx.client, prompt, s.request_timeout_s, max_tokens=max_tokens, num_draft_tokens=k)
        if alone.kind != "completed" or alone.text != greedy[(prompt, max_tokens, k)]:
            mismatches.append((prompt[:30], max_tokens, k, alone.kind))
    ctx.report.check(
        "mixed",
        "greedy streams equal the same request alone",
        bool(keys) and not mismatches,
        f"{len(keys) - len(mismatches)}/{len(keys)} equal"
        + (f"; first: {mismatches[0]}" if mismatches else ""),
        "all",
    )
    ctx.idle_checks("mixed")
