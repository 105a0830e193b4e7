"""Phase ``overload``: a burst of streams at once plus a small request some seconds in: every request
completes or is refused quickly, the small one gets its first token quickly, nothing hangs, the
server stays ready, KV blocks return to idle."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import NEVER_END_ID, PROMPTS, count, pct, run_stream


def run(ctx: Soak) -> None:
    s = ctx.s
    readiness: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            readiness.append(ctx.server.ready())
            stop.wait(0.5)

    def one(i: int) -> Outcome:
        prompt = PROMPTS[i % len(PROMPTS)]
        return run_stream(
            ctx.worker_client(),
            prompt,
            s.request_timeout_s,
            max_tokens=s.burst_max_tokens,
            end_id=NEVER_END_ID,
        )

    def small() -> Outcome:
        time.sleep(s.small_after_s)
        return run_stream(ctx.worker_client(), "The capital of France is", s.request_timeout_s, max_tokens=8)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    with ThreadPoolExecutor(s.burst + 1) as pool:
        small_future = pool.submit(small)
        outcomes = list(pool.map(one, range(s.burst)))
        small_out = small_future.result()
    elapsed = time.monotonic() - start
    stop.set()
    watcher.join(5)
    kinds = count(o.kind for o in outcomes)
    refusals = [o.total_s for o in outcomes if o.kind == "refused"]
    codes = count(f"{o.status or '-'}/{o.http_status or '-'}" for o in outcomes if o.kind == "refused")
    done = [o for o in outcomes if o.kind == "completed"]
    figures = {
        "burst": s.burst,
        "max_tokens": s.burst_max_tokens,
        "outcomes": kinds,
        "refusal_codes": codes,
        "refusal_latency_max_s": round(max(refusals, default=0.0), 3),
        "refusal_latency_p50_s": round(pct(refusals, 0.5), 3) if refusals else None,
        "completed_ttft_max_s": round(max((o.ttft_s or 0.0 for o in done), default=0.0), 3),
        "completed_total_max_s": round(max((o.total_s for o in done), default=0.0), 3),
        "small_request": {
            "kind": small_out.kind,
            "ttft_s": None if small_out.ttft_s is None else round(small_out.ttft_s, 3),
            "total_s": round(small_out.total_s, 3),
            "message": small_out.message[:200],
        },
        "ready_polls": len(readiness),
        "not_ready_polls": readiness.count(False),
        "elapsed_s": round(elapsed, 1),
    }
    ctx.report.figures["overload"] = figures
    ctx.log(f"overload: {json.dumps(figures)}")
    others = [o for o in outcomes if o.kind not in ("completed", "refused")]
    ctx.report.check(
        "overload",
        f"{s.burst} streams × {s.burst_max_tokens} tokens: each completes or is refused",
        not others,
        f"{kinds}" + (f"; first other: {others[0].kind} {others[0].message[:80]!r}" if others else ""),
        "completed + refused = all",
    )
    slow = [t for t in refusals if t > s.max_refusal_s]
    ctx.report.check(
        "overload",
        "refusals arrive quickly",
        not slow,
        f"max {figures['refusal_latency_max_s']} s over {len(refusals)} refusals",
        f"<= {s.max_refusal_s:g} s",
    )
    hung = [o for o in [*outcomes, small_out] if o.kind == "hung"]
    ctx.report.check("overload", "no request hung", not hung, f"{len(hung)} hit the client deadline", "0")
    ctx.report.check(
        "overload",
        f"small request (8 tokens, sent {s.small_after_s:g} s in): first token",
        small_out.ttft_s is not None and small_out.ttft_s <= s.max_small_ttft_s,
        f"{small_out.kind}, TTFT {figures['small_request']['ttft_s']} s"
        + (f" ({small_out.message[:60]!r})" if small_out.message else ""),
        f"<= {s.max_small_ttft_s:g} s",
    )
    ctx.report.check(
        "overload",
        "ready throughout the burst",
        bool(readiness) and all(readiness),
        f"{readiness.count(True)}/{len(readiness)} polls ready",
        "all",
    )
    ctx.idle_checks("overload")
