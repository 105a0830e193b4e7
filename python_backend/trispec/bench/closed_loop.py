"""A closed-loop load: ``concurrency`` clients, each sending its next request as soon as the previous
one finished, through the real scheduler and runner (in-flight batching: a new request joins the
running batch at the next step). Records when each request was sent, got its first token and its
last, and every request's tokens."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trispec.guided.spec import Guide
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.stats import EngineStats


@dataclass
class LoopResult:
    elapsed_s: float  # first request sent to last token
    token_ids: list[list[int]]  # per prompt, in prompt order
    ttft_s: list[float]  # per request: sent -> first token
    itl_s: list[float]  # per request of 2+ tokens: (last - first token) / (tokens - 1)
    stats: EngineStats
    repeats_agree: bool = True  # merged repeats all gave the same tokens
    repeats: int = 1
    run_seconds: list[float] = dataclasses.field(default_factory=list)  # each repeat's elapsed_s
    # the target's forwards: (rows, seconds in its kernel calls), where its model keeps a KernelClock
    kernel_forwards: list[tuple[int, float]] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.repeats * sum(len(t) for t in self.token_ids)

    @property
    def tok_s(self) -> float:
        return self.num_tokens / self.elapsed_s

    @property
    def tok_s_runs(self) -> list[float]:
        """Each repeat's tokens per second: how much one arm's own runs differ (the noise a ratio
        between arms is read against)."""
        per_run = sum(len(t) for t in self.token_ids)
        return [per_run / s for s in self.run_seconds or [self.elapsed_s]]

    @staticmethod
    def merged(results: Sequence[LoopResult]) -> LoopResult:
        """Repeats of one arm as one result: time and statistics summed, latencies pooled, the
        tokens of the first repeat (``identical`` says whether every repeat gave them)."""
        stats = EngineStats()
        for f in dataclasses.fields(EngineStats):
            values = [getattr(r.stats, f.name) for r in results]
            if f.name == "max_verify_batch":
                total: object = max(values)
            elif isinstance(values[0], list):
                total = [sum(v) for v in itertools.zip_longest(*values, fillvalue=0)]
            else:
                total = sum(values)
            setattr(stats, f.name, total)
        return LoopResult(
            sum(r.elapsed_s for r in results),
            results[0].token_ids,
            [t for r in results for t in r.ttft_s],
            [t for r in results for t in r.itl_s],
            stats,
            all(r.token_ids == results[0].token_ids for r in results),
            sum(r.repeats for r in results),
            [s for r in results for s in r.run_seconds or [r.elapsed_s]],
            [f for r in results for f in r.kernel_forwards],
        )


def run_closed_loop(
    engine: LLMEngine,
    prompts: list[list[int]],
    *,
    concurrency: int,
    max_tokens: int | Sequence[int],
    num_draft_tokens: int | None,
    on_finish: Callable[[], None] | None = None,
    sampling: Mapping[str, Any] | None = None,
    seeds: Sequence[int] | None = None,
    guides: Sequence[Guide | None] | None = None,
    guided_end_id: int | None = None,
    end_id: int | None = None,
) -> LoopResult:
    """``sampling``: temperature / top_k / top_p of every request (greedy when None); ``seeds``: the
    seed of each prompt's request, the same in every arm, so sampled arms can be compared token for
    token. ``guides``: each prompt's guide (structured output), None unguided; guided requests end with
    ``guided_end_id``, the rest with ``end_id`` (None: the engine's end ids; the bench's engines have
    none; -1: none, as a served request with ignore_eos). ``num_draft_tokens`` None: the engine's
    default. ``max_tokens``: one for all, or each prompt's."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    pending = deque(range(len(prompts)))
    prompt_of: dict[int, int] = {}  # request id -> prompt index
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    tokens: list[list[int]] = [[] for _ in prompts]

    def send() -> None:
        while pending and len(prompt_of) < concurrency:
            i = pending.popleft()
            request = GenerationRequest(
                prompt_token_ids=prompts[i],
                max_tokens=max_tokens if isinstance(max_tokens, int) else max_tokens[i],
                num_draft_tokens=num_draft_tokens,
                seed=seeds[i] if seeds is not None else None,
                guide=guides[i] if guides is not None else None,
                end_id=guided_end_id if guides is not None and guides[i] is not None else end_id,
                **(sampling or {}),
            )
            prompt_of[engine.add_request(request)] = i
            sent[i] = time.perf_counter()

    start = time.perf_counter()
    send()
    while prompt_of:
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            i = prompt_of[out.request_id]
            if out.error is not None:
                raise RuntimeError(f"request {i} failed: {out.error}")
            if out.new_token_ids:
                tokens[i].extend(out.new_token_ids)
                first.setdefault(i, now)
                last[i] = now
            if out.finished:
                del prompt_of[out.request_id]
                if on_finish is not None:
                    on_finish()
        send()
    elapsed = time.perf_counter() - start
    itl = [(last[i] - first[i]) / (len(tokens[i]) - 1) for i in first if len(tokens[i]) > 1]
    return LoopResult(elapsed, tokens, [first[i] - sent[i] for i in sorted(first)], itl, engine.stats)
