"""Phase ``failover`` (only when named: it kills a whole server): two replicas, the first at ``--url``
/ ``--http-url``, the second at ``--replica-url`` / ``--replica-http-url``. Streams over gRPC and HTTP
(greedy and seeded T = 0.8, k = 0 and 4, one sampled without a seed), each client knowing both
replicas and starting on the first, are in flight when the first replica goes away entirely (kill -9
of ``specdec-serve``, tritonserver and its stubs: a node lost).

- Both replicas serve the same model (same ``model_fingerprint``): every stream must be resumed on
  the second and end with the text of the same request run alone.
- They serve different models: every stream must end in ``SpecDecResumeError`` having delivered only
  a prefix of the first model's text; nothing from the second model is spliced in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trispec_client.client import SpecDecClient
from trispec_client.errors import ABORTED
from trispec_client.soak import fault
from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import PROMPTS, run_alone, run_stream
from trispec_client.soak.target import Server, find_server, kill_replica, split_host_port, wait_for_server

# Started beside the streams (e.g. a test's OpenAI requests): returns a function that waits for them.
Side = Callable[[str], Callable[[], None]]


def prompts_for(seed: int) -> tuple[str, ...]:
    """The fault phase's prompts for seed 0; the soak's wider set, rotated, for any other seed (a
    held-out run: other prompts, other lengths)."""
    if seed == 0:
        return fault.PROMPTS
    return tuple(PROMPTS[(seed + i) % len(PROMPTS)] for i in range(4))


def run(ctx: Soak, side: Side | None = None) -> None:
    s = ctx.s
    if not s.replica_url:
        ctx.report.check("failover", "two replicas", None, "skipped: no --replica-url")
        return
    first = {"grpc": s.url, "http": s.http_url}
    second = {"grpc": s.replica_url, "http": s.replica_http_url or s.replica_url}
    protocols = ("http",) if s.protocol == "http" else ("grpc", "http")
    ports = sorted({split_host_port(first[p])[1] for p in protocols})
    # (a replica whose supervisor is restarting its tritonserver is waited for: killing it then
    # would kill nothing, and the streams would start on the second)
    if wait_for_server(ports, first["http"], s.request_timeout_s) is None:
        ctx.report.check(
            "failover", "kill -9 of the first replica", None, f"skipped: no local server on {ports}"
        )
        return
    fingerprints = [
        _fingerprint(s, urls["grpc" if "grpc" in protocols else "http"], protocols[0])
        for urls in (first, second)
    ]
    same_model = fingerprints[0] == fingerprints[1] and fingerprints[0] is not None
    streams = fault.fault_streams(s.fault_streams, s.fault_max_tokens, protocols, prompts_for(s.seed))
    # what each request gives alone, on a replica that serves the model the streams begin on (the
    # unseeded one needs the seed it is told: done after, and only where that model still runs)
    alone_on = second if same_model else first
    alone = run_alone(
        [
            (_client(s, [alone_on[st.protocol]], st.protocol, resume=False), st.prompt, st.params)
            for st in streams[:-1]
        ],
        s.request_timeout_s,
    )
    outcomes: list[Outcome | None] = [None] * len(streams)
    started = [threading.Event() for _ in streams]
    furthest = threading.Event()  # some stream has --failover-kill-after-tokens tokens

    def one(i: int) -> None:
        stream = streams[i]
        client = _client(s, [first[stream.protocol], second[stream.protocol]], stream.protocol, resume=True)

        def seen(out: Outcome) -> None:
            started[i].set()
            if out.tokens >= s.failover_kill_after_tokens:
                furthest.set()

        try:
            outcomes[i] = run_stream(
                client, stream.prompt, s.request_timeout_s, on_outcome=seen, **stream.params
            )
        finally:
            started[i].set()
            furthest.set()

    waiting = side("failover") if side is not None else None
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(streams))]
    for thread in threads:
        thread.start()
    # every stream under way, the furthest this far (streams with short prompts run ahead of those
    # still prefilling long ones: waiting for all of them to have N tokens could see some finish)
    for event in started:
        event.wait(s.request_timeout_s)
    furthest.wait(s.request_timeout_s)
    killed = kill_replica(ports)
    killed_at = time.monotonic()
    ctx.log(f"failover: killed the first replica (pids {killed}) with {len(streams)} streams in flight")
    for thread in threads:
        thread.join(s.request_timeout_s + s.resume_timeout_s)
    done_s = time.monotonic() - killed_at
    if waiting is not None:
        waiting()
    results = [o or Outcome(kind="hung", message="the stream never ended") for o in outcomes]
    ctx.report.figures["failover"] = {
        "fingerprints": fingerprints,
        "killed": killed,
        "done_after_kill_s": round(done_s, 1),
        "resumed": [o.resumed for o in results],
        "outcomes": [o.kind for o in results],
        "tokens_at_end": [o.tokens for o in results],
    }
    ctx.report.check(
        "failover",
        "the first replica is gone",
        find_server(ports) is None and bool(killed),
        f"killed {len(killed)} processes",
    )
    if same_model:
        last = streams[-1]
        unseeded = {**last.params, "seed": results[-1].seed}
        alone.append(
            run_stream(
                _client(s, [second[last.protocol]], last.protocol, resume=False),
                last.prompt,
                s.request_timeout_s,
                **unseeded,
            )
        )
        _same_model_checks(
            ctx, streams, results, alone, done_s, Server(second["http"], s.replica_metrics_url or "")
        )
    else:
        _other_model_checks(ctx, streams, results, alone, fingerprints)


def _same_model_checks(
    ctx: Soak,
    streams: list[fault.FaultStream],
    results: list[Outcome],
    alone: list[Outcome],
    done_s: float,
    replica: Server,
) -> None:
    n = len(streams)
    bad = [
        f"{st.label}: {o.kind} {o.message[:100]!r}"
        for st, o in zip(streams, results)
        if o.kind != "completed"
    ]
    ctx.report.check(
        "failover",
        f"kill -9 of the first replica with {n} streams in flight: each completes on the second",
        not bad,
        f"{n - len(bad)}/{n} complete, {done_s:.1f} s after the kill"
        + (f"; first bad: {bad[0]}" if bad else ""),
        "all",
    )
    ctx.report.check(
        "failover",
        "each stream was cut and resumed",
        all(o.resumed >= 1 for o in results),
        f"resumed {[o.resumed for o in results]}",
        ">= 1 each",
    )
    differ = [
        st.label for st, o, a in zip(streams, results, alone) if a.kind != "completed" or a.text != o.text
    ]
    ctx.report.check(
        "failover",
        "texts equal to the same request run alone",
        not differ,
        f"{n - len(differ)}/{n} equal" + (f"; first: {differ[0]}" if differ else ""),
        "all",
    )
    if replica.metrics_url:
        resumed = replica.metric("specdec_resumed_streams_total")
        ctx.report.check(
            "failover",
            "the second replica counted the resumed streams",
            resumed >= n,
            f"specdec_resumed_streams_total {resumed:g}",
            f">= {n}",
        )


def _other_model_checks(
    ctx: Soak,
    streams: list[fault.FaultStream],
    results: list[Outcome],
    alone: list[Outcome],
    fingerprints: list[str | None],
) -> None:
    n = len(streams)
    refused = [
        o.kind == "error" and o.status == ABORTED and "model fingerprint" in o.message for o in results
    ]
    first_bad = next(
        (f"{st.label}: {o.kind} {o.message[:120]!r}" for st, o, r in zip(streams, results, refused) if not r),
        "",
    )
    ctx.report.check(
        "failover",
        f"replicas serving other models ({fingerprints[0]}, {fingerprints[1]}): each resume refused",
        all(refused),
        f"{sum(refused)}/{n} refused" + (f"; first bad: {first_bad}" if first_bad else ""),
        "all",
    )
    # the unseeded stream's text alone needs the dead replica: its prefix is checked for the others
    spliced = [
        st.label
        for st, o, a in zip(streams, results, alone)
        if not (a.kind == "completed" and a.text.startswith(o.text) and len(o.text) < len(a.text))
    ]
    ctx.report.check(
        "failover",
        "nothing spliced: each delivered a strict prefix of the first model's text alone",
        not spliced,
        f"{n - 1 - len(spliced)}/{n - 1} prefixes" + (f"; first: {spliced[0]}" if spliced else ""),
        "all",
    )


def _fingerprint(s: Any, url: str, protocol: str) -> str | None:
    """The model fingerprint a replica names in its first response (one greedy token)."""
    client = _client(s, [url], protocol, resume=False)
    for chunk in client.stream("Hi", max_tokens=1, num_draft_tokens=0):
        return chunk.model_fingerprint
    return None


def _client(s: Any, urls: list[str], protocol: str, *, resume: bool) -> SpecDecClient:
    return SpecDecClient(
        urls,
        protocol=protocol,  # type: ignore[arg-type]
        timeout_s=s.request_timeout_s,
        retries=0,
        resume=resume,
        resume_timeout_s=s.resume_timeout_s,
        routing="round-robin",  # a new client's first request goes to the first replica: the one killed
    )
