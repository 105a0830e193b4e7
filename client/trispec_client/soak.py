"""specdec-soak: a bounded soak and fault run against a specdec server on this machine.

Phases (``--phases``, all by default), each bounded in time and count:
  mixed     N concurrent streams of mixed prompts, max_tokens, greedy/sampled and k; every stream must
            end with a final response, and each greedy one must equal the same request run alone
  cancel    a storm of streams cancelled at random points; afterwards the KV blocks return to idle
            and the server is still ready
  overload  a burst of streams at once plus a small request some seconds in: every request completes
            or is refused quickly, the small one gets its first token quickly, nothing hangs, the
            server stays ready, KV blocks return to idle
  bad       a catalogue of bad requests, each refused with the expected code and counted by reason in
            specdec_requests_rejected_total; a 10 MB prompt is refused fast while a stream runs on
  memory    (throughout) the Python stub's RSS, sampled every second: growth after the first minute

Prints a pass/fail table (``--json``: one JSON object). Exit status: 0 every check passed, 1 a check
failed, 2 bad arguments (a host that is not loopback without ``--allow-remote``).
``--short`` is the CI profile (under 2 minutes); the defaults are the long operator run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import json
import math
import random
import re
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import urllib3

from trispec_client.client import PROTOCOLS, SpecDecClient
from trispec_client.errors import UNAVAILABLE, SpecDecError, SpecDecTimeoutError

PROG = "specdec-soak"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
PHASES = ("mixed", "cancel", "overload", "bad", "memory")
STUB_NAME = "triton_python_backend_stub"
# an id SmolLM2 never emits: a stream that only max_tokens or a cancel ends
NEVER_END_ID = 49151

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village, there lived an old clockmaker who",
    "Water boils at",
    "Write a short poem about the sea.\n" * 3,
    "Explain how a hash map works, step by step, in plain words. " * 8,
    "héllo wörld, naïve café 😀 — ",
)
# how the server words a retryable refusal (queue full, queue delay): over a gRPC stream Triton 2.51
# delivers a model's error without its status code, so the message is what tells a refusal apart
REFUSAL = re.compile(r"retry later|scheduler\.max_waiting|scheduler\.max_queue_delay_s|shutting down")


# -- results ------------------------------------------------------------------------------------------
@dataclass
class Check:
    phase: str
    name: str
    passed: bool | None  # None: skipped (not counted as a failure)
    value: str
    limit: str = ""


@dataclass
class Outcome:
    """What became of one request, seen from the client."""

    kind: str = "completed"  # completed | refused | error | hung | cancelled
    text: str = ""
    chunks: int = 0
    tokens: int = 0
    ttft_s: float | None = None
    total_s: float = 0.0
    max_gap_s: float = 0.0
    finish_reason: str | None = None
    message: str = ""
    status: str | None = None
    http_status: int | None = None


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, phase: str, name: str, passed: bool | None, value: object, limit: object = "") -> None:
        self.checks.append(Check(phase, name, passed, str(value), str(limit)))

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)


# -- the server --------------------------------------------------------------------------------------
def split_host_port(url: str) -> tuple[str, int]:
    parsed = urllib3.util.parse_url(url if "://" in url else f"http://{url}")
    if not parsed.host or parsed.port is None:
        raise ValueError(f"expected host:port, got {url!r}")
    return parsed.host.strip("[]"), parsed.port


def is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class Server:
    """Readiness, metrics and the stub's memory of the server under test."""

    def __init__(self, http_url: str, metrics_url: str) -> None:
        self.http_url, self.metrics_url = http_url, metrics_url
        self._pool = urllib3.PoolManager(timeout=urllib3.Timeout(connect=2, read=5), retries=False)

    def ready(self) -> bool:
        try:
            return self._pool.request("GET", f"http://{self.http_url}/v2/health/ready").status == 200
        except Exception:
            return False

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = self._pool.request("GET", f"http://{self.metrics_url}/metrics").data.decode()
        samples = {}
        for line in text.splitlines():
            match = re.match(r"^(specdec_\w+)(?:\{(.*)\})? (\S+)$", line)
            if match:
                labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
                samples[(match.group(1), labels)] = float(match.group(3))
        return samples

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 when none yet)."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == name and wanted <= ls)

    def rejected(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for (name, labels), value in self.metrics().items():
            if name == "specdec_requests_rejected_total":
                reason = dict(labels).get("reason", "")
                counts[reason] = counts.get(reason, 0.0) + value
        return counts

    def kv_state(self) -> tuple[float, float, float, float]:
        """(target blocks used, target blocks free, running, waiting)."""
        m = self.metrics()

        def get(name: str, **labels: str) -> float:
            return sum(v for (n, ls), v in m.items() if n == name and set(labels.items()) <= ls)

        return (
            get("specdec_kv_blocks_used", pool="target"),
            get("specdec_kv_blocks_free", pool="target"),
            get("specdec_running_sequences"),
            get("specdec_waiting_sequences"),
        )

    def wait_idle(self, idle_free: float, timeout_s: float) -> tuple[bool, tuple[float, ...], float]:
        """Wait until nothing runs or waits and the target's free KV blocks are back at ``idle_free``."""
        start = time.monotonic()
        state: tuple[float, ...] = ()
        while time.monotonic() - start < timeout_s:
            with contextlib.suppress(Exception):
                state = self.kv_state()
                used, free, running, waiting = state
                if used == 0 and free == idle_free and running == 0 and waiting == 0:
                    return True, state, time.monotonic() - start
            time.sleep(0.2)
        return False, state, time.monotonic() - start


def find_stub(ports: list[int]) -> int | None:
    """The pid of the Python stub under the tritonserver that listens on one of ``ports``."""
    import psutil

    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if not cmdline or not cmdline[0].endswith("tritonserver"):
            continue
        flags = " ".join(cmdline)
        if not any(re.search(rf"--(?:grpc|http)-port[= ]{port}\b", flags) for port in ports):
            continue
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                argv = child.cmdline()
                # Triton first runs ``sh -c <stub>`` once as a check: the real stub has its own argv
                if argv and argv[0].endswith(STUB_NAME) and child.status() != psutil.STATUS_ZOMBIE:
                    return child.pid
    return None


class RssSampler:
    """Samples one process's RSS every ``interval_s`` on a background thread."""

    def __init__(self, pid: int, interval_s: float = 1.0) -> None:
        import psutil

        self.pid, self.interval_s = pid, interval_s
        self._proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self.lost = False  # the process went away (crashed or restarted)
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic() - self._start, self._proc.memory_info().rss))
            except Exception:
                self.lost = True
                return
            self._stop.wait(self.interval_s)

    def at(self, t: float) -> int | None:
        """The first sample taken at or after ``t`` seconds."""
        return next((rss for s, rss in self.samples if s >= t), None)


# -- one request -------------------------------------------------------------------------------------
def is_refusal(error: SpecDecError) -> bool:
    return error.status == UNAVAILABLE or error.http_status == 503 or bool(REFUSAL.search(error.message))


def run_stream(
    client: SpecDecClient,
    prompt: str,
    timeout_s: float,
    cancel_after_chunks: int | None = None,
    on_chunk: Callable[[float], None] | None = None,
    **params: Any,
) -> Outcome:
    """One streamed request, timed; leaving early (``cancel_after_chunks``) cancels it on the server."""
    out = Outcome()
    start = last = time.monotonic()
    stream = client.stream(prompt, timeout_s=timeout_s, **params)
    try:
        for chunk in stream:
            now = time.monotonic()
            if out.chunks:
                out.max_gap_s = max(out.max_gap_s, now - last)
            else:
                out.ttft_s = now - start
            last = now
            out.chunks += 1
            out.text += chunk.text
            out.tokens = chunk.token_count
            if on_chunk is not None:
                on_chunk(now)
            if chunk.final:
                out.finish_reason = chunk.finish_reason
                break
            if cancel_after_chunks is not None and out.chunks >= cancel_after_chunks:
                out.kind = "cancelled"
                break
        else:
            out.kind, out.message = "error", "the stream ended without a final response"
    except SpecDecTimeoutError as exc:
        out.kind, out.message, out.status = "hung", exc.message, exc.status
    except SpecDecError as exc:
        out.kind = "refused" if is_refusal(exc) else "error"
        out.message, out.status, out.http_status = exc.message, exc.status, exc.http_status
    except Exception as exc:  # a transport bug is a finding, not a crash of the soak
        out.kind, out.message = "error", f"{type(exc).__name__}: {exc}"
    finally:
        stream.close()
        out.total_s = time.monotonic() - start
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- phases ------------------------------------------------------------------------------------------
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


class Soak:
    def __init__(self, settings: Settings, report: Report, log: Callable[[str], None]) -> None:
        self.s = settings
        self.report = report
        self.log = log
        self.rng = random.Random(settings.seed)
        self.server = Server(settings.http_url, settings.metrics_url)
        # retries=0: a refusal is an outcome the soak counts (is_refusal), not something to hide
        self.client = SpecDecClient(
            settings.url, protocol=settings.protocol, timeout_s=settings.request_timeout_s, retries=0
        )
        self.idle_free = self.server.kv_state()[1]

    def _client(self) -> SpecDecClient:
        # HTTP: a pool per worker keeps connections apart; gRPC opens a stream per request anyway
        if self.s.protocol == "http":
            return SpecDecClient(self.s.url, protocol="http", timeout_s=self.s.request_timeout_s, retries=0)
        return self.client

    def _idle_checks(self, phase: str) -> None:
        ok, state, waited = self.server.wait_idle(self.idle_free, self.s.idle_timeout_s)
        used, free, running, waiting = state or (math.nan,) * 4
        self.report.check(
            phase,
            "KV blocks back to idle",
            ok,
            f"used {used:g}, free {free:g} (idle {self.idle_free:g}), running {running:g}, "
            f"waiting {waiting:g} after {waited:.1f} s",
            f"within {self.s.idle_timeout_s:g} s",
        )
        self.report.check(
            phase, "server ready after", self.server.ready(), "ready" if self.server.ready() else "NOT ready"
        )

    # 1. mixed streams ----------------------------------------------------------------------------
    def mixed(self) -> None:
        s = self.s
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
            client = self._client()
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
        kinds = _count(out.kind for _, out in outcomes)
        tokens = sum(out.tokens for _, out in outcomes)
        ttfts = [out.ttft_s for _, out in outcomes if out.ttft_s is not None]
        self.report.figures["mixed"] = {
            "requests": len(outcomes),
            "outcomes": kinds,
            "elapsed_s": round(elapsed, 1),
            "tokens_per_s": round(tokens / elapsed, 1) if elapsed else 0.0,
            "ttft_p50_s": round(pct(ttfts, 0.5), 3),
            "ttft_max_s": round(max(ttfts, default=math.nan), 3),
        }
        self.log(f"mixed: {len(outcomes)} requests in {elapsed:.0f} s, {kinds}")
        # more streams than the batch holds: the server may refuse some (retryable, by design)
        refused = sum(o.kind == "refused" for _, o in outcomes)
        ended = [(p, o) for p, o in outcomes if o.kind != "refused"]
        bad = [(p, o) for p, o in ended if o.kind != "completed" or not o.finish_reason]
        self.report.check(
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
            alone = run_stream(
                self.client, prompt, s.request_timeout_s, max_tokens=max_tokens, num_draft_tokens=k
            )
            if alone.kind != "completed" or alone.text != greedy[(prompt, max_tokens, k)]:
                mismatches.append((prompt[:30], max_tokens, k, alone.kind))
        self.report.check(
            "mixed",
            "greedy streams equal the same request alone",
            bool(keys) and not mismatches,
            f"{len(keys) - len(mismatches)}/{len(keys)} equal"
            + (f"; first: {mismatches[0]}" if mismatches else ""),
            "all",
        )
        self._idle_checks("mixed")

    # 2. cancel storm -----------------------------------------------------------------------------
    def cancel(self) -> None:
        s = self.s
        before = self.server.metric("specdec_requests_total", finish_reason="cancelled")

        def one(i: int) -> Outcome:
            rng = random.Random(s.seed * 7919 + i)
            client = self._client()
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
        kinds = _count(o.kind for o in outcomes)
        self.log(f"cancel: {kinds}")
        errors = [o for o in outcomes if o.kind not in ("cancelled", "completed", "refused")]
        self.report.figures["cancel"] = {"streams": len(outcomes), "outcomes": kinds}
        self.report.check(
            "cancel",
            f"{s.cancel_streams} streams cancelled at random points",
            not errors,
            f"{kinds}" + (f"; first error: {errors[0].message[:80]!r}" if errors else ""),
            "no errors",
        )
        self._idle_checks("cancel")
        cancelled = self.server.metric("specdec_requests_total", finish_reason="cancelled") - before
        self.report.figures["cancel"]["server_cancelled"] = cancelled
        self.report.check(
            "cancel",
            "server counted the cancels",
            cancelled > 0,
            f"specdec_requests_total{{finish_reason=cancelled}} +{cancelled:g}",
            "> 0",
        )

    # 3. overload burst ---------------------------------------------------------------------------
    def overload(self) -> None:
        s = self.s
        readiness: list[bool] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                readiness.append(self.server.ready())
                stop.wait(0.5)

        def one(i: int) -> Outcome:
            prompt = PROMPTS[i % len(PROMPTS)]
            return run_stream(
                self._client(),
                prompt,
                s.request_timeout_s,
                max_tokens=s.burst_max_tokens,
                end_id=NEVER_END_ID,
            )

        def small() -> Outcome:
            time.sleep(s.small_after_s)
            return run_stream(self._client(), "The capital of France is", s.request_timeout_s, max_tokens=8)

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
        kinds = _count(o.kind for o in outcomes)
        refusals = [o.total_s for o in outcomes if o.kind == "refused"]
        codes = _count(f"{o.status or '-'}/{o.http_status or '-'}" for o in outcomes if o.kind == "refused")
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
        self.report.figures["overload"] = figures
        self.log(f"overload: {json.dumps(figures)}")
        others = [o for o in outcomes if o.kind not in ("completed", "refused")]
        self.report.check(
            "overload",
            f"{s.burst} streams × {s.burst_max_tokens} tokens: each completes or is refused",
            not others,
            f"{kinds}" + (f"; first other: {others[0].kind} {others[0].message[:80]!r}" if others else ""),
            "completed + refused = all",
        )
        slow = [t for t in refusals if t > s.max_refusal_s]
        self.report.check(
            "overload",
            "refusals arrive quickly",
            not slow,
            f"max {figures['refusal_latency_max_s']} s over {len(refusals)} refusals",
            f"<= {s.max_refusal_s:g} s",
        )
        hung = [o for o in [*outcomes, small_out] if o.kind == "hung"]
        self.report.check(
            "overload", "no request hung", not hung, f"{len(hung)} hit the client deadline", "0"
        )
        self.report.check(
            "overload",
            f"small request (8 tokens, sent {s.small_after_s:g} s in): first token",
            small_out.ttft_s is not None and small_out.ttft_s <= s.max_small_ttft_s,
            f"{small_out.kind}, TTFT {figures['small_request']['ttft_s']} s"
            + (f" ({small_out.message[:60]!r})" if small_out.message else ""),
            f"<= {s.max_small_ttft_s:g} s",
        )
        self.report.check(
            "overload",
            "ready throughout the burst",
            bool(readiness) and all(readiness),
            f"{readiness.count(True)}/{len(readiness)} polls ready",
            "all",
        )
        self._idle_checks("overload")

    # 4. bad-input catalogue ----------------------------------------------------------------------
    def bad(self) -> None:
        s = self.s
        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30), retries=False)
        url = f"http://{s.http_url}/v2/models/specdec/generate_stream"
        # (name, JSON body, HTTP status, text the error must contain, rejection reason the model counts;
        # None: refused by Triton itself, before the model sees it)
        catalogue: list[tuple[str, dict[str, Any], int, str, str | None]] = [
            ("misspelled key", {"text_input": "hi", "max_token": 4}, 400, "max_token", "unknown_parameter"),
            ("unknown key", {"text_input": "hi", "frobnicate": 1}, 400, "frobnicate", "unknown_parameter"),
            ("empty prompt", {"text_input": ""}, 400, "text_input", "invalid_input"),
            ("max_tokens 0", {"text_input": "hi", "max_tokens": 0}, 400, "max_tokens", "invalid_input"),
            ("max_tokens -5", {"text_input": "hi", "max_tokens": -5}, 400, "max_tokens", "invalid_input"),
            (
                "num_draft_tokens 99",
                {"text_input": "hi", "num_draft_tokens": 99},
                400,
                "num_draft_tokens",
                "invalid_input",
            ),
            (
                "temperature -0.5",
                {"text_input": "hi", "temperature": -0.5},
                400,
                "temperature",
                "invalid_input",
            ),
            ("top_p 1.5", {"text_input": "hi", "top_p": 1.5}, 400, "top_p", "invalid_input"),
            ("top_k -1", {"text_input": "hi", "top_k": -1}, 400, "top_k", "invalid_input"),
            (
                "end_id out of vocab",
                {"text_input": "hi", "end_id": 10_000_000},
                400,
                "end_id",
                "invalid_input",
            ),
            ("beam_width 2", {"text_input": "hi", "beam_width": 2}, 400, "beam_width", "invalid_input"),
            # under max_prompt_bytes but more tokens than the context: refused once tokenised
            ("prompt over the context", {"text_input": "word " * 2500}, 400, "text_input", "too_long"),
            ("wrong dtype (string max_tokens)", {"text_input": "hi", "max_tokens": "abc"}, 500, "", None),
            ("wrong dtype (float max_tokens)", {"text_input": "hi", "max_tokens": 1.5}, 500, "", None),
            # a batch of prompts is served (one sequence per row), not refused: not in the catalogue
        ]
        before = self.server.rejected()
        expected: dict[str, int] = {}
        results = []
        for name, body, status, needle, reason in catalogue:
            resp = http.request("POST", url, json=body)
            text = resp.data.decode(errors="replace")
            ok = resp.status == status and needle in text
            results.append((name, ok, resp.status, text[:120]))
            if reason:
                expected[reason] = expected.get(reason, 0) + 1
        # over gRPC: what JSON cannot say (Triton checks these itself; the model never sees them)
        grpc_cases = _grpc_bad_inputs(s.url) if s.protocol == "grpc" else []
        results.extend(grpc_cases)
        failed = [r for r in results if not r[1]]
        self.report.figures["bad"] = {
            "cases": [{"name": n, "ok": ok, "status": st, "body": b} for n, ok, st, b in results]
        }
        self.report.check(
            "bad",
            f"{len(results)} bad requests refused with the expected code, naming the field",
            not failed,
            f"{len(results) - len(failed)}/{len(results)}"
            + (f"; first wrong: {failed[0]}" if failed else ""),
            "all",
        )

        # a 10 MB prompt: refused on its size in milliseconds, while a running stream is not paused
        size = int(s.oversized_mb * (1 << 20))
        gaps: list[float] = []
        state = {"last": 0.0, "window": False}

        def on_chunk(now: float) -> None:
            if state["window"] and state["last"]:
                gaps.append(now - state["last"])
            state["last"] = now

        runner_started = threading.Event()
        running: list[Outcome] = []

        def stream() -> None:
            def tick(now: float) -> None:
                runner_started.set()
                on_chunk(now)

            running.append(
                run_stream(
                    self._client(), PROMPTS[2], s.request_timeout_s, on_chunk=tick,
                    max_tokens=160, end_id=NEVER_END_ID, num_draft_tokens=0,
                )
            )  # fmt: skip

        thread = threading.Thread(target=stream)
        thread.start()
        runner_started.wait(s.request_timeout_s)
        time.sleep(1.0)  # a few normal gaps first
        before_gaps_at = time.monotonic()
        state["window"] = True
        latencies, statuses = [], []
        huge = json.dumps({"text_input": "x" * size}).encode()
        for _ in range(3):
            t = time.monotonic()
            resp = http.request("POST", url, body=huge, headers={"Content-Type": "application/json"})
            latencies.append(time.monotonic() - t)
            statuses.append((resp.status, "serving.max_prompt_bytes" in resp.data.decode(errors="replace")))
        expected["too_long"] = expected.get("too_long", 0) + 3
        window_s = time.monotonic() - before_gaps_at
        time.sleep(0.5)
        state["window"] = False
        thread.join(s.request_timeout_s)
        stream_out = running[0] if running else Outcome(kind="hung")
        self.report.figures["oversized"] = {
            "bytes": size,
            "refusal_latency_s": [round(x, 3) for x in latencies],
            "statuses": statuses,
            "stream_max_gap_during_s": round(max(gaps, default=0.0), 3),
            "stream_median_gap_during_s": round(statistics.median(gaps), 3) if gaps else None,
            "window_s": round(window_s, 3),
            "stream": stream_out.kind,
        }
        self.report.check(
            "bad",
            f"{s.oversized_mb:g} MB prompt refused (400, max_prompt_bytes) quickly",
            all(st == 400 and named for st, named in statuses) and max(latencies) <= s.max_oversized_s,
            f"max {max(latencies) * 1e3:.0f} ms, {statuses}",
            f"<= {s.max_oversized_s:g} s",
        )
        self.report.check(
            "bad",
            "a running stream is not paused meanwhile",
            stream_out.kind == "completed" and bool(gaps) and max(gaps) <= s.max_stream_gap_s,
            f"{stream_out.kind}, largest inter-token gap during {max(gaps, default=math.nan) * 1e3:.0f} ms "
            f"({len(gaps)} gaps)",
            f"<= {s.max_stream_gap_s:g} s",
        )
        time.sleep(0.5)  # the metrics port updates after the model counted
        after = self.server.rejected()
        deltas = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in {*expected, *after}}
        wrong = {r: (deltas.get(r, 0.0), n) for r, n in expected.items() if deltas.get(r, 0.0) != n}
        self.report.figures["bad"]["rejected_delta"] = deltas
        self.report.check(
            "bad",
            "each refusal counted in specdec_requests_rejected_total{reason}",
            not wrong,
            ", ".join(f"{r} +{deltas.get(r, 0.0):g}" for r in sorted(expected))
            + (f"; wrong: {wrong}" if wrong else ""),
            ", ".join(f"{r} +{n}" for r, n in sorted(expected.items())),
        )
        self.report.check(
            "bad", "server ready after", self.server.ready(), "ready" if self.server.ready() else "NOT ready"
        )


def _grpc_bad_inputs(url: str) -> list[tuple[str, bool, int, str]]:
    """Bad tensors over a gRPC stream: (name, refused naming the input, 0, message)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    cases = [
        ("gRPC wrong dtype (FP32 max_tokens)", "max_tokens", np.array([[1.5]], dtype=np.float32), "FP32"),
        ("gRPC unknown input", "no_such_input", np.array([[3]], dtype=np.int32), "INT32"),
    ]
    results = []
    for name, tensor_name, array, dtype in cases:
        prompt = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        prompt.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
        extra = grpcclient.InferInput(tensor_name, list(array.shape), dtype)
        extra.set_data_from_numpy(array)
        got: list[Any] = []
        done = threading.Event()
        client = grpcclient.InferenceServerClient(url)
        try:
            client.start_stream(callback=functools.partial(_note, got, done), stream_timeout=30)
            client.async_stream_infer("specdec", [prompt, extra], enable_empty_final_response=True)
            done.wait(30)
            client.stop_stream(cancel_requests=True)
        finally:
            client.close()
        error = got[0][1] if got else None
        message = "" if error is None else (error.message() or str(error))
        results.append((name, error is not None and tensor_name in message, 0, message[:120]))
    return results


def _note(got: list[Any], done: threading.Event, result: Any, error: Any) -> None:
    got.append((result, error))
    done.set()


def _count(items: Iterator[str] | Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


# -- memory ------------------------------------------------------------------------------------------
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


# -- command line ------------------------------------------------------------------------------------
SHORT = {
    "streams": 8,
    "mixed_duration_s": 40.0,
    "mixed_requests": 200,
    "greedy_checks": 3,
    "cancel_streams": 24,
    # under scheduler.max_batch_size (32): every request is admitted at once, so the small one must
    # start at once too (the long profile's 300 is what overloads)
    "burst": 24,
    "burst_max_tokens": 16,
    "small_after_s": 1.0,
    "max_small_ttft_s": 30.0,
    "max_refusal_s": 5.0,
    "rss_baseline_s": 20.0,
    "max_rss_growth": 0.10,
    "memory_min_run_s": 40.0,
    "max_stream_gap_s": 5.0,
    "max_oversized_s": 2.0,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--url", help="the server for the streams (default: 127.0.0.1:8001 for grpc, :8000 for http)"
    )
    p.add_argument("--protocol", choices=PROTOCOLS, default="grpc")
    p.add_argument(
        "--http-url", help="HTTP host:port for readiness and the bad-input catalogue (default: <host>:8000)"
    )
    p.add_argument("--metrics-url", help="metrics host:port (default: <host>:8002)")
    p.add_argument("--allow-remote", action="store_true", help="allow a host that is not loopback")
    p.add_argument("--short", action="store_true", help="the CI profile: small counts, under 2 minutes")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stub-pid", type=int, help="the Python stub to watch (default: found from the ports)")
    g = p.add_argument_group("mixed streams")
    g.add_argument("--streams", type=int, default=64, help="concurrent streams (default: %(default)s)")
    g.add_argument("--mixed-duration-s", type=float, default=600.0, help="default: %(default)s")
    g.add_argument(
        "--mixed-requests", type=int, default=100_000, help="at most this many (default: %(default)s)"
    )
    g.add_argument(
        "--greedy-checks", type=int, default=8, help="greedy streams rerun alone (default: %(default)s)"
    )
    g = p.add_argument_group("cancel storm")
    g.add_argument("--cancel-streams", type=int, default=200, help="default: %(default)s")
    g = p.add_argument_group("overload burst")
    g.add_argument("--burst", type=int, default=300, help="streams sent at once (default: %(default)s)")
    g.add_argument("--burst-max-tokens", type=int, default=256, help="default: %(default)s")
    g.add_argument(
        "--small-after-s", type=float, default=3.0, help="when the small request goes (default: %(default)s)"
    )
    g.add_argument(
        "--max-refusal-s", type=float, default=2.0, help="pass: refusals within (default: %(default)s)"
    )
    g.add_argument(
        "--max-small-ttft-s", type=float, default=5.0, help="pass: small TTFT within (default: %(default)s)"
    )
    g = p.add_argument_group("bad input")
    g.add_argument("--oversized-mb", type=float, default=10.0, help="default: %(default)s")
    g.add_argument(
        "--max-oversized-s", type=float, default=0.5, help="pass: refused within (default: %(default)s)"
    )
    g.add_argument(
        "--max-stream-gap-s",
        type=float,
        default=1.0,
        help="pass: running stream's gap (default: %(default)s)",
    )
    g = p.add_argument_group("memory")
    g.add_argument(
        "--rss-baseline-s", type=float, default=60.0, help="growth measured from here (default: %(default)s)"
    )
    g.add_argument("--max-rss-growth", type=float, default=0.05, help="pass: fraction (default: %(default)s)")
    g.add_argument(
        "--memory-min-run-s", type=float, default=120.0, help="skip the check below (default: %(default)s)"
    )
    g = p.add_argument_group("bounds")
    g.add_argument("--request-timeout-s", type=float, default=300.0, help="client deadline: past it = hung")
    g.add_argument(
        "--idle-timeout-s", type=float, default=30.0, help="wait for KV back to idle (default: %(default)s)"
    )
    return p


def settings_from(args: argparse.Namespace, argv: list[str]) -> Settings:
    host, _ = split_host_port(args.url or "127.0.0.1:8001")
    host = f"[{host}]" if ":" in host else host
    values = {name: getattr(args, name) for name in Settings.__dataclass_fields__ if hasattr(args, name)}
    if args.short:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
        values.update({k: v for k, v in SHORT.items() if k not in given})
        if "request_timeout_s" not in given:
            values["request_timeout_s"] = 90.0
        if "idle_timeout_s" not in given:
            values["idle_timeout_s"] = 20.0
    values["url"] = args.url or f"{host}:{8001 if args.protocol == 'grpc' else 8000}"
    values["http_url"] = args.http_url or (values["url"] if args.protocol == "http" else f"{host}:8000")
    values["metrics_url"] = args.metrics_url or f"{host}:8002"
    return Settings(**values)


def render(report: Report, out: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="specdec soak", show_lines=False)
    for column in ("phase", "check", "result", "value", "limit"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        result = "[green]PASS" if c.passed else "[yellow]SKIP" if c.passed is None else "[red]FAIL"
        table.add_row(c.phase, c.name, result, c.value, c.limit)
    console = Console(file=out, width=160)
    console.print(table)
    console.print(
        "[green]PASS" if report.passed else "[red]FAIL",
        f"({sum(c.passed is False for c in report.checks)} failed)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if unknown := [p for p in phases if p not in PHASES]:
        parser.error(f"--phases: unknown {', '.join(unknown)} (known: {', '.join(PHASES)})")
    try:
        s = settings_from(args, argv)
        hosts = {split_host_port(u)[0] for u in (s.url, s.http_url, s.metrics_url)}
    except ValueError as exc:
        parser.error(str(exc))
    remote = sorted(h for h in hosts if not is_loopback(h))
    if remote and not args.allow_remote:
        print(
            f"{PROG}: refusing {', '.join(remote)}: not a loopback address (--allow-remote to override)",
            file=sys.stderr,
        )
        return EXIT_USAGE

    def log(line: str) -> None:
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    report = Report()
    server = Server(s.http_url, s.metrics_url)
    if not server.ready():
        report.check("setup", "server ready", False, f"http://{s.http_url}/v2/health/ready not 200")
        _finish(report, args.json)
        return EXIT_FAILED
    sampler = None
    if "memory" in phases and not remote:
        pid = args.stub_pid or find_stub(sorted({split_host_port(u)[1] for u in (s.url, s.http_url)}))
        if pid is not None:
            sampler = RssSampler(pid)
            sampler.start()
    start = time.monotonic()
    soak = Soak(s, report, log)
    for phase in ("mixed", "cancel", "overload", "bad"):
        if phase in phases:
            t = time.monotonic()
            log(f"{phase}: start")
            try:
                getattr(soak, phase)()
            except Exception as exc:  # a phase that cannot run is a failed check, and the rest still run
                report.check(phase, "phase ran", False, f"{type(exc).__name__}: {exc}")
            report.figures.setdefault("phase_s", {})[phase] = round(time.monotonic() - t, 1)
    elapsed = time.monotonic() - start
    if sampler is not None:
        sampler.stop()
    if "memory" in phases:
        memory_checks(sampler, report, s, elapsed)
    report.figures["elapsed_s"] = round(elapsed, 1)
    _finish(report, args.json)
    return EXIT_OK if report.passed else EXIT_FAILED


def _finish(report: Report, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "passed": report.passed,
                    "checks": [asdict(c) for c in report.checks],
                    "figures": report.figures,
                }
            )
        )
    else:
        render(report, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
