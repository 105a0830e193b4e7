"""The ``scheduler`` section of scripts/gpu_spec_bench.py: the 7B target as served (Scheduler +
TorchSpecRunner + GraphRound; ``capture=False`` on the CPU, so the counts are real there too), one
row per arm and batch with ``ms_per_step``, ``graph_rounds`` and ``eager_rounds`` (steps whose decodes
ran eagerly, some or all):

* ``plain``: greedy, no drafter; ``host_ms`` = its ms per step less the bare graph decode's
  (the step section's, context 512): the host's work per step;
* ``model``: the 0.5B draft, k = 3 (random weights: it accepts next to nothing, so this is the
  mechanics' cost);
* ``sampled``: as ``plain`` at temperature 0.7, each request seeded (the coupled rule on the device);
* ``suffix``: greedy, suffix drafts (model-free, on the verify graph);
* ``mix``: twice the batch of requests through ``batch`` slots, so newcomers arrive (their prompts
  fed beside the others' decodes) while others decode; every other request sampled, suffix drafts.

Before an arm's timed drain, every graph it can replay is captured: each padded size up to its batch's,
in each sampler mode its requests can make (a mix's batch shrinks and grows as requests come and go:
a size first met inside the timing would be captured there).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from gpu_bench_plan import SCHEDULER_K
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.engine.gpu.cuda_graphs import padded_size
from trispec.engine.torch_engine import TorchEngine
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.graph_round import GraphRound
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler

GREEDY_ARMS = ("plain", "model", "suffix")
SAMPLED_ARMS = ("sampled", "mix")
K = SCHEDULER_K


class _NoText:
    """Random weights have no tokenizer: the scheduler's text is left empty."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ""


def _llm(b: Any, target: TorchEngine, drafter: Drafter | None, batch: int) -> LLMEngine:
    graphs = GraphRound(target, drafter, max_k=K, sizes=b.p.sizes, capture=b.cuda, fused=b.fused)
    runner = TorchSpecRunner(target, drafter, graphs)
    config = SchedulerConfig(
        max_num_draft_tokens=K,
        default_num_draft_tokens=0,
        max_batch_size=batch,
        adaptive_speculation=False,
        max_waiting=None,
        max_queue_delay_s=None,
    )
    scheduler = Scheduler(runner, config, encode=lambda text: [],
                          make_text_tracker=lambda stop: StopTextTracker(_NoText(), stop),
                          eos_ids=frozenset())  # fmt: skip
    return LLMEngine(scheduler, runner)


def _requests(b: Any, arm: str, n: int, vocab: int, tokens: int) -> list[GenerationRequest]:
    rng = random.Random(n)
    out = []
    for i in range(n):
        sampled = arm == "sampled" or (arm == "mix" and i % 2)
        out.append(
            GenerationRequest(
                prompt_token_ids=[rng.randrange(vocab) for _ in range(b.p.prompt)],
                max_tokens=tokens if arm != "mix" else rng.randrange(tokens // 2, tokens + 1),
                num_draft_tokens=0 if arm in ("plain", "sampled") else K,
                temperature=0.7 if sampled else 0.0,
                seed=1000 + i if sampled else None,
            )
        )
    return out


def _drain(llm: LLMEngine, requests: list[GenerationRequest]) -> None:
    for r in requests:
        llm.add_request(r)
    while llm.has_work():
        llm.step()


def scheduler_arm(b: Any, target: TorchEngine, draft: TorchEngine, arm: str, batch: int) -> dict[str, Any]:
    drafter: Drafter | None = None
    if arm == "model":
        drafter = ModelDrafter(draft)
    elif arm in ("suffix", "mix"):
        drafter = SuffixDrafter(target.vocab_size)
    llm = _llm(b, target, drafter, batch)
    runner = llm.runner
    tokens = b.tokens // 2 if batch > 1 else b.tokens
    _drain(llm, _requests(b, arm, batch, target.vocab_size, 4))  # warm-up
    capture_all(runner.graphs, batch, sampled=arm in SAMPLED_ARMS)  # type: ignore[attr-defined]
    steps, graph, eager = llm.stats.steps, runner.graph_rounds, runner.eager_rounds  # type: ignore[attr-defined]
    b.sync()
    t = time.perf_counter()
    _drain(llm, _requests(b, arm, 2 * batch if arm == "mix" else batch, target.vocab_size, tokens))
    b.sync()
    seconds = time.perf_counter() - t
    steps = llm.stats.steps - steps
    return {
        "ms_per_step": round(1e3 * seconds / steps, 3),
        "steps": steps,
        "graph_rounds": runner.graph_rounds - graph,  # type: ignore[attr-defined]
        "eager_rounds": runner.eager_rounds - eager,  # type: ignore[attr-defined]
        "acceptance": round(llm.stats.acceptance_rate, 3),
    }


def capture_all(graphs: GraphRound, batch: int, sampled: bool) -> None:
    """Capture every graph size up to ``batch``'s in greedy mode and, for sampled arms, with noise
    (temperature only: no top-k / top-p or log-probs in these arms)."""
    from trispec.sampling.graph_sampler import GREEDY, SamplerMode

    modes = [GREEDY, SamplerMode(noise=True)] if sampled else [GREEDY]
    top = padded_size(min(batch, graphs.sizes[-1]), graphs.sizes) or graphs.sizes[-1]
    for size in [s for s in graphs.sizes if s <= top]:
        for mode in modes:
            graphs.verify.ensure_captured(size, mode)
            if graphs.first is not None and graphs.next is not None:
                graphs.first.ensure_captured(size, mode)
                graphs.next.ensure_captured(size, mode)


def scheduler_section(b: Any, target: TorchEngine, draft: TorchEngine, arms: tuple[str, ...]) -> None:
    ctx = b.p.contexts[0]
    for arm in arms:
        for batch in b.p.batches:
            if not b.time_left(6 if b.tiny else 20):
                b.emit(section="scheduler", arm=arm, batch=batch, skipped="time budget")
                continue
            row = b.section("scheduler", scheduler_arm, b, target, draft, arm, batch)
            if row is None:
                continue
            bare = b.graph_ms.get(("7b", ctx, batch, 1))
            if arm == "plain" and bare:
                row["host_ms"] = round(row["ms_per_step"] - bare * 1e3, 3)
            b.emit(section="scheduler", arm=arm, batch=batch, **row)
