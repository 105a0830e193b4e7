"""Phase ``fault`` (not run unless named in ``--phases``: it kills processes): streams in flight over
gRPC and HTTP, greedy and seeded (T = 0.8), k = 0 and 4, plus one sampled stream sent without a seed,
while the Python stub is killed (kill -9); then the same while tritonserver itself is killed. The
supervisor (``specdec-serve``) brings the model back, the client resumes every stream
(``trispec_client.resume``), and each must end complete with the text of the same request run alone
(the unseeded one: alone with the seed the server reported in its first response).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trispec_client.client import SpecDecClient
from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import NEVER_END_ID, run_alone, run_stream
from trispec_client.soak.target import find_server, find_stub, split_host_port

TEMPERATURE = 0.8
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at",
)
# what each of a protocol's streams asks for, in turn: (seeded sampling, k)
KINDS = ((False, 4), (False, 0), (True, 4), (True, 0))
TARGETS = ("stub", "tritonserver")
# Started beside each round's streams (e.g. a test's OpenAI requests): returns a function that waits
# for them, called once the round's own streams are done.
Side = Callable[[str], Callable[[], None]]


@dataclass(frozen=True)
class FaultStream:
    protocol: str
    prompt: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        p = self.params
        sampling = "greedy" if "temperature" not in p else f"T={p['temperature']}"
        seed = "" if "temperature" not in p else f" seed {p.get('seed', 'none')}"
        return f"{self.protocol} {sampling}{seed} k={p['num_draft_tokens']}"


def fault_streams(
    count: int, max_tokens: int, protocols: tuple[str, ...], prompts: tuple[str, ...] = PROMPTS
) -> list[FaultStream]:
    """``count`` streams spread over ``protocols``, each protocol cycling through ``KINDS``, and one
    sampled stream without a seed (the server picks and reports it)."""
    streams = []
    for i in range(count):
        protocol = protocols[i * len(protocols) // count]
        seeded, k = KINDS[i % len(KINDS)]
        params: dict[str, Any] = {"max_tokens": max_tokens, "end_id": NEVER_END_ID, "num_draft_tokens": k}
        if seeded:
            params.update(temperature=TEMPERATURE, seed=1000 + i)
        streams.append(FaultStream(protocol, prompts[i % len(prompts)], params))
    unseeded = {"max_tokens": max_tokens, "end_id": NEVER_END_ID, "num_draft_tokens": 4}
    streams.append(FaultStream(protocols[0], prompts[0], {**unseeded, "temperature": TEMPERATURE}))
    return streams


def run(ctx: Soak, side: Side | None = None) -> None:
    for target in TARGETS:
        kill_round(ctx, target, side)


def kill_round(ctx: Soak, target: str, side: Side | None = None) -> None:
    """One kill -9 of ``target`` (``stub`` or ``tritonserver``) with the streams in flight; the checks
    go into the report under phase ``fault``."""
    s = ctx.s
    urls = {"http": s.http_url} if s.protocol == "http" else {"grpc": s.url, "http": s.http_url}
    streams = fault_streams(s.fault_streams, s.fault_max_tokens, tuple(urls))
    ports = sorted({split_host_port(u)[1] for u in urls.values()})
    find = find_stub if target == "stub" else find_server
    if find(ports) is None:
        ctx.report.check("fault", f"{target} kill -9", None, f"skipped: no local {target} on ports {ports}")
        return
    outcomes: list[Outcome | None] = [None] * len(streams)
    started = [threading.Event() for _ in streams]

    def one(i: int) -> None:
        stream = streams[i]
        client = _client(s, stream.protocol, urls[stream.protocol], resume=True)
        try:
            outcomes[i] = run_stream(
                client,
                stream.prompt,
                s.request_timeout_s,
                on_chunk=lambda _: started[i].set(),
                **stream.params,
            )
        finally:
            started[i].set()

    waiting = side(target) if side is not None else None
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(streams))]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(s.request_timeout_s)
    pid = find(ports)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    ctx.log(f"fault: killed {target} (pid {pid}) with {len(streams)} streams in flight")
    for thread in threads:
        thread.join(s.request_timeout_s + s.resume_timeout_s)
    done_s = time.monotonic() - killed_at
    if waiting is not None:
        waiting()
    ready = _wait_ready(ctx, s.resume_timeout_s)
    results = [o or Outcome(kind="hung", message="the stream never ended") for o in outcomes]
    _checks(ctx, target, streams, results, urls, pid, done_s, ready)
    # the restarted server counts from 0: the resumed requests it received
    resumed = ctx.server.metric("specdec_resumed_streams_total")
    cut = sum(o.resumed > 0 for o in results)
    ctx.report.check(
        "fault",
        f"{target} kill -9: the restarted server counted the resumed streams",
        resumed >= cut > 0,
        f"specdec_resumed_streams_total {resumed:g}, {cut} streams resumed",
        ">= streams resumed",
    )


def _checks(
    ctx: Soak,
    target: str,
    streams: list[FaultStream],
    results: list[Outcome],
    urls: dict[str, str],
    pid: int | None,
    done_s: float,
    ready: bool,
) -> None:
    n = len(streams)
    complete = [o.kind == "completed" and o.finish_reason is not None for o in results]
    bad = [
        f"{st.label}: {o.kind} {o.message[:100]!r}" for st, o, ok in zip(streams, results, complete) if not ok
    ]
    ctx.report.figures.setdefault("fault", {})[target] = {
        "pid": pid,
        "streams": n,
        "done_after_kill_s": round(done_s, 1),
        "resumed": [o.resumed for o in results],
        "outcomes": [o.kind for o in results],
    }
    ctx.report.check(
        "fault",
        f"{target} kill -9 with {n} streams in flight: each completes",
        all(complete),
        f"{sum(complete)}/{n} complete, {done_s:.1f} s after the kill"
        + (f"; first bad: {bad[0]}" if bad else ""),
        "all",
    )
    ctx.report.check(
        "fault",
        f"{target} kill -9: each stream was cut and resumed",
        all(o.resumed >= 1 for o in results),
        f"resumed {[o.resumed for o in results]}",
        ">= 1 each",
    )
    ctx.report.check(
        "fault", f"{target} kill -9: server ready again", ready, "ready" if ready else "NOT ready"
    )
    unseeded = results[-1]
    ctx.report.check(
        "fault",
        f"{target} kill -9: the stream sent without a seed was told its seed",
        unseeded.seed is not None,
        f"seed {unseeded.seed}",
        "a seed in the first response",
    )
    equal, first_diff = 0, ""
    for stream, outcome, alone in zip(streams, results, _alone(ctx, streams, results, urls)):
        if alone.kind == "completed" and alone.text == outcome.text:
            equal += 1
        elif not first_diff:
            first_diff = f"{stream.label}: {outcome.text[:40]!r} vs alone {alone.text[:40]!r} ({alone.kind})"
    ctx.report.check(
        "fault",
        f"{target} kill -9: texts equal to the same request run alone",
        equal == n,
        f"{equal}/{n} equal" + (f"; first: {first_diff}" if first_diff else ""),
        "all",
    )


def _alone(
    ctx: Soak, streams: list[FaultStream], results: list[Outcome], urls: dict[str, str]
) -> list[Outcome]:
    """Each stream's request run alone (the unseeded one with the seed it was told), all at once;
    kept for the next kill round, which sends the same requests."""
    s = ctx.s
    keyed = []
    for stream, outcome in zip(streams, results):
        params = dict(stream.params)
        if "temperature" in params and "seed" not in params:
            params["seed"] = outcome.seed
        keyed.append((repr((stream.protocol, stream.prompt, sorted(params.items()))), stream, params))
    missing = [(key, st, p) for key, st, p in keyed if key not in ctx.alone]
    done = run_alone(
        [(_client(s, st.protocol, urls[st.protocol], resume=False), st.prompt, p) for _, st, p in missing],
        s.request_timeout_s,
    )
    fresh = {key: outcome for (key, _, _), outcome in zip(missing, done)}
    ctx.alone.update({key: o for key, o in fresh.items() if o.kind == "completed"})
    return [ctx.alone.get(key) or fresh[key] for key, _, _ in keyed]


def _client(s: Any, protocol: str, url: str, *, resume: bool) -> SpecDecClient:
    return SpecDecClient(
        url,
        protocol=protocol,
        timeout_s=s.request_timeout_s,
        retries=0,
        resume=resume,
        resume_timeout_s=s.resume_timeout_s,
    )


def _wait_ready(ctx: Soak, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ctx.server.ready():
            return True
        time.sleep(0.5)
    return False
