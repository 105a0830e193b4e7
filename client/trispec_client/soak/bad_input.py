"""Phase ``bad``: a catalogue of bad requests, each refused with the expected code and counted by
reason in specdec_requests_rejected_total; a 10 MB prompt is refused fast while a stream runs on."""

from __future__ import annotations

import functools
import json
import math
import statistics
import threading
import time
from typing import Any

import urllib3

from trispec_client.soak.context import Soak
from trispec_client.soak.report import Outcome
from trispec_client.soak.stream import NEVER_END_ID, PROMPTS, run_stream

# (name, JSON body, HTTP status, text the error must contain, rejection reason the model counts;
# None: refused by Triton itself, before the model sees it)
CATALOGUE: list[tuple[str, dict[str, Any], int, str, str | None]] = [
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
    # (an end_id past the vocabulary is taken: never generated, as TensorRT-LLM takes it)
    ("end_id -2", {"text_input": "hi", "end_id": -2}, 400, "end_id", "invalid_input"),
    ("beam_width 2", {"text_input": "hi", "beam_width": 2}, 400, "beam_width", "invalid_input"),
    # under max_prompt_bytes but more tokens than the context: refused once tokenised
    ("prompt over the context", {"text_input": "word " * 2500}, 400, "text_input", "too_long"),
    ("wrong dtype (string max_tokens)", {"text_input": "hi", "max_tokens": "abc"}, 500, "", None),
    ("wrong dtype (float max_tokens)", {"text_input": "hi", "max_tokens": 1.5}, 500, "", None),
    # a batch of prompts is served (one sequence per row), not refused: not in the catalogue
]


def run(ctx: Soak) -> None:
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=30), retries=False)
    url = f"http://{ctx.s.http_url}/v2/models/specdec/generate_stream"
    before = ctx.server.rejected()
    expected: dict[str, int] = {}
    _codes(ctx, http, url, expected)
    _oversized(ctx, http, url, expected)
    _counted(ctx, before, expected)


def _codes(ctx: Soak, http: urllib3.PoolManager, url: str, expected: dict[str, int]) -> None:
    """Each catalogue entry (and the gRPC-only ones) refused with its code, naming the field."""
    s = ctx.s
    results = []
    for name, body, status, needle, reason in CATALOGUE:
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
    ctx.report.figures["bad"] = {
        "cases": [{"name": n, "ok": ok, "status": st, "body": b} for n, ok, st, b in results]
    }
    ctx.report.check(
        "bad",
        f"{len(results)} bad requests refused with the expected code, naming the field",
        not failed,
        f"{len(results) - len(failed)}/{len(results)}" + (f"; first wrong: {failed[0]}" if failed else ""),
        "all",
    )


def _oversized(ctx: Soak, http: urllib3.PoolManager, url: str, expected: dict[str, int]) -> None:
    """A 10 MB prompt: refused on its size in milliseconds, while a running stream is not paused."""
    s = ctx.s
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
                ctx.worker_client(), PROMPTS[2], s.request_timeout_s, on_chunk=tick,
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
    ctx.report.figures["oversized"] = {
        "bytes": size,
        "refusal_latency_s": [round(x, 3) for x in latencies],
        "statuses": statuses,
        "stream_max_gap_during_s": round(max(gaps, default=0.0), 3),
        "stream_median_gap_during_s": round(statistics.median(gaps), 3) if gaps else None,
        "window_s": round(window_s, 3),
        "stream": stream_out.kind,
    }
    ctx.report.check(
        "bad",
        f"{s.oversized_mb:g} MB prompt refused (400, max_prompt_bytes) quickly",
        all(st == 400 and named for st, named in statuses) and max(latencies) <= s.max_oversized_s,
        f"max {max(latencies) * 1e3:.0f} ms, {statuses}",
        f"<= {s.max_oversized_s:g} s",
    )
    ctx.report.check(
        "bad",
        "a running stream is not paused meanwhile",
        stream_out.kind == "completed" and bool(gaps) and max(gaps) <= s.max_stream_gap_s,
        f"{stream_out.kind}, largest inter-token gap during {max(gaps, default=math.nan) * 1e3:.0f} ms "
        f"({len(gaps)} gaps)",
        f"<= {s.max_stream_gap_s:g} s",
    )


def _counted(ctx: Soak, before: dict[str, float], expected: dict[str, int]) -> None:
    """Each refusal counted in specdec_requests_rejected_total{reason}."""
    time.sleep(0.5)  # the metrics port updates after the model counted
    after = ctx.server.rejected()
    deltas = {r: after.get(r, 0.0) - before.get(r, 0.0) for r in {*expected, *after}}
    wrong = {r: (deltas.get(r, 0.0), n) for r, n in expected.items() if deltas.get(r, 0.0) != n}
    ctx.report.figures["bad"]["rejected_delta"] = deltas
    ctx.report.check(
        "bad",
        "each refusal counted in specdec_requests_rejected_total{reason}",
        not wrong,
        ", ".join(f"{r} +{deltas.get(r, 0.0):g}" for r in sorted(expected))
        + (f"; wrong: {wrong}" if wrong else ""),
        ", ".join(f"{r} +{n}" for r, n in sorted(expected.items())),
    )
    ctx.report.check(
        "bad", "server ready after", ctx.server.ready(), "ready" if ctx.server.ready() else "NOT ready"
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
