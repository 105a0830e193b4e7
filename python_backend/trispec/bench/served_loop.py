"""One timed run of an arm of ``specdec-bench-served``: the prompts sent closed-loop by ``clients``
clients (each sends its next prompt when its previous answer has ended), over HTTP to a server, or to
our engine in this process (the offline figure of the same prompts), as one :class:`ArmRun`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trispec.bench.closed_loop import run_closed_loop
from trispec.bench.openai_stream import Completion
from trispec.llm_engine import LLMEngine


@dataclass(frozen=True)
class ArmRun:
    elapsed_s: float  # first request sent to last token
    ttft_s: tuple[float, ...]  # per request
    decode_tokens: int  # tokens after each request's first, summed
    decode_s: float  # each request's first token to its last, summed
    tokens: int  # all tokens generated

    @property
    def tok_s(self) -> float:
        """Aggregate: every token over the run's wall time (first-token times included)."""
        return self.tokens / self.elapsed_s


def served_run(
    send: Callable[[list[int]], Completion], prompts: Sequence[list[int]], clients: int, max_tokens: int
) -> ArmRun:
    """``clients`` threads, each taking the next prompt when its previous answer has ended. Every answer
    must be ``max_tokens`` long (the end token ignored): a shorter one would make less work."""
    if clients < 1:
        raise ValueError("clients must be >= 1")
    done: list[Completion | None] = [None] * len(prompts)
    errors: list[BaseException] = []
    lock = threading.Lock()
    queue = iter(range(len(prompts)))

    def client() -> None:
        while True:
            with lock:
                if errors:
                    return
                i = next(queue, None)
            if i is None:
                return
            try:
                done[i] = send(prompts[i])
            except BaseException as exc:  # the run fails with it, in the main thread
                with lock:
                    errors.append(exc)
                return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, len(prompts)))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    end = time.perf_counter()
    if errors:
        raise errors[0]
    completions = [c for c in done if c is not None]
    short = [c.tokens for c in completions if c.tokens != max_tokens]
    if short:
        raise RuntimeError(
            f"answers of {short} tokens, not max_tokens {max_tokens} (ignore_eos not honoured?)"
        )
    return ArmRun(
        elapsed_s=max(c.last_s for c in completions) - start if completions else end - start,
        ttft_s=tuple(c.ttft_s for c in completions),
        decode_tokens=sum(c.tokens - 1 for c in completions),
        decode_s=sum(c.decode_s for c in completions),
        tokens=sum(c.tokens for c in completions),
    )


def offline_run(
    engine: LLMEngine, prompts: Sequence[list[int]], clients: int, max_tokens: int, k: int | None
) -> ArmRun:
    """The same prompts through ``engine`` in this process, closed-loop through its in-flight batcher
    (``run_closed_loop``): ``k`` None is the config's default (as a request without num_draft_tokens),
    0 plain; no end id, as ``ignore_eos``."""
    result = run_closed_loop(
        engine, list(prompts), concurrency=clients, max_tokens=max_tokens, num_draft_tokens=k, end_id=-1
    )
    lengths = {len(t) for t in result.token_ids}
    if lengths != {max_tokens}:
        raise RuntimeError(f"offline answers of {sorted(lengths)} tokens, not max_tokens {max_tokens}")
    # every request has max_tokens tokens: its inter-token latency times max_tokens - 1 is its decode time
    return ArmRun(
        elapsed_s=result.elapsed_s,
        ttft_s=tuple(result.ttft_s),
        decode_tokens=len(prompts) * (max_tokens - 1),
        decode_s=sum(itl * (max_tokens - 1) for itl in result.itl_s),
        tokens=len(prompts) * max_tokens,
    )
