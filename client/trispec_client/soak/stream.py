"""One request of the soak, timed and classified; the prompts the phases draw from."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from trispec_client.client import SpecDecClient
from trispec_client.errors import UNAVAILABLE, SpecDecError, SpecDecTimeoutError
from trispec_client.soak.report import Outcome

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


def is_refusal(error: SpecDecError) -> bool:
    return error.status == UNAVAILABLE or error.http_status == 503 or bool(REFUSAL.search(error.message))


def run_stream(
    client: SpecDecClient,
    prompt: str,
    timeout_s: float,
    cancel_after_chunks: int | None = None,
    on_chunk: Callable[[float], None] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    **params: Any,
) -> Outcome:
    """One streamed request, timed; leaving early (``cancel_after_chunks``) cancels it on the server.
    ``on_chunk(time)`` and ``on_outcome(outcome so far)`` are called after each chunk."""
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
            out.seed = chunk.seed if out.seed is None else out.seed
            if chunk.stats is not None:
                out.resumed = chunk.stats.resumed
            if on_chunk is not None:
                on_chunk(now)
            if on_outcome is not None:
                on_outcome(out)
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


def run_alone(requests: list[tuple[SpecDecClient, str, dict[str, Any]]], timeout_s: float) -> list[Outcome]:
    """Each (client, prompt, params) request run to the end, all at once: a greedy or seeded
    request's text does not depend on what shares the batch, so together gives each one's text alone
    in the time of one."""
    outcomes = [Outcome(kind="hung", message="did not end") for _ in requests]

    def one(i: int) -> None:
        client, prompt, params = requests[i]
        outcomes[i] = run_stream(client, prompt, timeout_s, **params)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 5)
    return outcomes


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def count(items: Iterator[str] | Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts
