"""Phase ``cancel``: a storm of streams cancelled at random points; afterwards the KV blocks return
to idle, the server is still ready and counted the cancels."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import NEVER_END_ID, PROMPTS, count, run_stream


def run(ctx: Soak) -> None:
    s = ctx.s
    before = ctx.server.metric("specdec_requests_total", finish_reason="cancelled")

    def one(i: int) -> Outcome:
        rng = random.Random(s.seed * 7919 + i)
        client = ctx.worker_client()
        params = {"max_tokens": 256, "end_id": NEVER_END_ID, "num_draft_tokens": rng.choice([0, 2, 4, 8])}
        if rng.random() < 0.3:
            # cancelled by the client's deadline, possibly before the first token
            out = run_stream(client, rng.choice(PROMPTS), rng.uniform(0.05, 2.0), **params)
            if out.kind == "hung":
                out.kind = "cancelled"
            return out
        return run_stream(
            client,
            rng.choice(PROMPTS),
            s.request_timeout_s,
            cancel_after_chunks=rng.randint(1, 6),
            **params,
        )

    with ThreadPoolExecutor(min(s.cancel_streams, 64)) as pool:
        outcomes = list(pool.map(one, range(s.cancel_streams)))
    kinds = count(o.kind for o in outcomes)
    ctx.log(f"cancel: {kinds}")
    errors = [o for o in outcomes if o.kind not in ("cancelled", "completed", "refused")]
    ctx.report.figures["cancel"] = {"streams": len(outcomes), "outcomes": kinds}
    ctx.report.check(
        "cancel",
        f"{s.cancel_streams} streams cancelled at random points",
        not errors,
        f"{kinds}" + (f"; first error: {errors[0].message[:80]!r}" if errors else ""),
        "no errors",
    )
    ctx.idle_checks("cancel")
    cancelled = ctx.server.metric("specdec_requests_total", finish_reason="cancelled") - before
    ctx.report.figures["cancel"]["server_cancelled"] = cancelled
    ctx.report.check(
        "cancel",
        "server counted the cancels",
        cancelled > 0,
        f"specdec_requests_total{{finish_reason=cancelled}} +{cancelled:g}",
        "> 0",
    )
