"""The generation sections of scripts/gpu_spec_bench.py: ``GraphRound`` driven directly (no scheduler).

* plain decoding on graphs at each batch (and eager at batch 1);
* speculative decoding, 0.5B draft -> 7B target, with an oracle of per-position acceptance ``a``: the
  draft's replays run for real (its cost is real), its proposals are then replaced on the device by the
  oracle's token, kept with probability ``a`` (else a wrong one). The oracle is **re-derived from the
  run's own verified output**: a first, untimed pass drafts from the plain run's text and records what
  the speculative run itself emits; the timed pass drafts from that. The verify's numbers depend on the
  token prefix and the batch, not on which row a token sits in, so the second pass keeps to its oracle
  past any bf16 near-tie where verify and plain decoding part (the first H100 run's k >= 4 rows broke
  there). Where the timed output and plain first differ, a ``divergence`` row gives the position and
  the target's two logits there (from an eager forward of the speculative prefix);
* the same sampled (``temperature`` 0.7, seeded: the coupled rule on the device), and with a suffix
  draft (model-free: proposals staged with the verify rows, no draft replays).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Any

import torch
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.runners.graph_round import GraphRound
from trispec.sampling import coupled_tokens
from trispec.sampling_params import SamplingParams
from trispec.step import SeqStep

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.7, seed=1234)


def prompts(b: Any, batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(vocab) for _ in range(16 if b.tiny else 64)] for _ in range(batch)]


class Generation:
    """Sequences decoded by ``GraphRound`` rounds, as the runner would drive them (one batched eager
    prefill first). A sampled run seeds sequence i with ``seed + i``."""

    def __init__(
        self,
        graphs: GraphRound,
        drafter: Drafter | None,
        batch_prompts: list[list[int]],
        sampling: SamplingParams,
    ) -> None:
        self.graphs, self.drafter = graphs, drafter
        target = graphs.target
        self.sids = list(range(700_000, 700_000 + len(batch_prompts)))
        self.params = [
            replace(sampling, prompt_len=len(p), seed=None if sampling.greedy else sampling.seed + i)  # type: ignore[operator]
            for i, p in enumerate(batch_prompts)
        ]
        for sid in self.sids:
            target.add_sequence(sid, target.max_context)
            if drafter is not None:
                drafter.add_sequence(sid, target.max_context)
        logits = target.forward([ForwardInput(sid, p, 1) for sid, p in zip(self.sids, batch_prompts)])
        first = coupled_tokens(torch.cat([row[-1:] for row in logits]), self.params, [0] * len(self.sids))
        if isinstance(drafter, ModelDrafter):
            drafter.engine.forward([ForwardInput(sid, p, 0) for sid, p in zip(self.sids, batch_prompts)])
        self.tokens = [[*p, t] for p, t in zip(batch_prompts, first)]
        self.computed = [len(p) for p in batch_prompts]
        self.prompt_len = [len(p) for p in batch_prompts]
        self.rounds = 0

    def output(self, i: int) -> list[int]:
        return self.tokens[i][self.prompt_len[i] :]

    def round(self, k: int) -> None:
        steps = [
            SeqStep(sid, list(toks), n, len(toks), k, sp)
            for sid, toks, n, sp in zip(self.sids, self.tokens, self.computed, self.params)
        ]
        plan = self.graphs.plan(steps, drafting_off=False)
        assert plan is not None, "the round did not qualify for the graphs"
        rollback = self.drafter.rollback if self.drafter is not None else (lambda s, n: None)
        outcome = self.graphs.run(steps, plan, rollback)
        assert not outcome.eager, "a kept set did not fit the device's width"
        for i, sid in enumerate(self.sids):
            r = outcome.result.results[sid]
            self.tokens[i].extend(r.new_token_ids)
            self.computed[i] = r.num_computed
        self.rounds += 1

    def free(self) -> None:
        for sid in self.sids:
            self.graphs.target.free(sid)
            if self.drafter is not None:
                self.drafter.free(sid)


def tokens_for(b: Any, batch: int) -> int:
    return b.tokens if batch == 1 else max(b.tokens // 2, 8)


def plain(b: Any, target: TorchEngine, batch: int, sampling: SamplingParams = GREEDY) -> tuple[float, list]:
    """Plain decoding on graphs: tok/s and each sequence's output."""
    graphs = GraphRound(target, None, max_k=0, sizes=b.sizes, capture=b.cuda, fused=b.fused)
    gen = Generation(graphs, None, prompts(b, batch, target.vocab_size), sampling)
    gen.round(0)  # captures
    b.sync()
    t = time.perf_counter()
    while len(gen.output(0)) < tokens_for(b, batch):
        gen.round(0)
    seconds = time.perf_counter() - t
    made = sum(len(gen.output(i)) - 2 for i in range(batch))
    outputs = [gen.output(i) for i in range(batch)]
    gen.free()
    b.emit(section="plain", path="graph", batch=batch, temperature=sampling.temperature,
           tok_s=round(made / seconds, 1), graph_mb=round(graphs.graph_bytes / 2**20, 1))  # fmt: skip
    return made / seconds, outputs


def plain_eager(b: Any, target: TorchEngine) -> None:
    sid, prompt = 600_000, prompts(b, 1, target.vocab_size)[0]
    target.add_sequence(sid, target.max_context)
    token = int(target.forward([ForwardInput(sid, prompt, 1)])[0][-1].argmax())
    n = min(b.tokens, 64)
    t = time.perf_counter()
    for _ in range(n):
        token = int(target.forward([ForwardInput(sid, [token], 1)])[0][-1].argmax())
    b.emit(section="plain", path="eager", batch=1, tok_s=round(n / (time.perf_counter() - t), 1))
    target.free(sid)


def _oracle_run(
    b: Any, target: TorchEngine, drafter: Drafter, k: int, a: float | None, reference: list[list[int]],
    sampling: SamplingParams,
) -> tuple[float, int, int, list[list[int]]]:  # fmt: skip
    """One run at batch ``len(reference)``: seconds, tokens made, rounds, outputs. ``a`` None: the
    drafter's own proposals."""
    batch = len(reference)
    graphs = GraphRound(target, drafter, max_k=k, sizes=b.sizes, capture=b.cuda, fused=b.fused)
    gen = Generation(graphs, drafter, prompts(b, batch, target.vocab_size), sampling)
    rng = random.Random(int(1000 * (a or 1)) + k + batch)
    staged = torch.zeros(batch, k, dtype=torch.int64, pin_memory=b.cuda)
    vocab = target.vocab_size

    def override(drafts: torch.Tensor) -> None:
        for s in range(batch):
            done = len(gen.output(s))
            for i in range(k):
                right = reference[s][done + i] if done + i < len(reference[s]) else 0
                staged[s, i] = right if rng.random() < a else (right + 1) % vocab  # type: ignore[operator]
        drafts[:batch].copy_(staged[:, : drafts.shape[1]], non_blocking=True)

    if a is not None:
        graphs.draft_override = override
    gen.round(k)  # captures
    b.sync()
    start_tokens = sum(len(gen.output(s)) for s in range(batch))
    start_rounds = gen.rounds
    t = time.perf_counter()
    while len(gen.output(0)) < tokens_for(b, batch):
        gen.round(k)
    seconds = time.perf_counter() - t
    made = sum(len(gen.output(s)) for s in range(batch)) - start_tokens
    outputs = [gen.output(s) for s in range(batch)]
    gen.free()
    return seconds, made, (gen.rounds - start_rounds) * batch, outputs


def speculative(
    b: Any, target: TorchEngine, drafter: Drafter, k: int, a: float | None, plain_out: list[list[int]],
    plain_tok_s: float, label: str, sampling: SamplingParams = GREEDY,
) -> None:  # fmt: skip
    """A ``spec`` row (and, greedy, a ``divergence`` row) at batch ``len(plain_out)``."""
    reference = plain_out
    if a is not None:  # the oracle, re-derived from the run's own verified output
        reference = _oracle_run(b, target, drafter, k, a, plain_out, sampling)[3]
    seconds, made, rounds, out = _oracle_run(b, target, drafter, k, a, reference, sampling)
    batch = len(plain_out)
    expected = (1 - a ** (k + 1)) / (1 - a) if a is not None else None
    matched = [
        sum(x == y for x, y in zip(o, p)) / max(min(len(o), len(p)), 1) for o, p in zip(out, plain_out)
    ]
    b.emit(section="spec", draft=label, batch=batch, k=k, a=a, temperature=sampling.temperature,
           tok_s=round(made / seconds, 1), speedup=round(made / seconds / plain_tok_s, 3),
           tokens_per_round=round(made / rounds, 3),
           expected_tokens_per_round=None if expected is None else round(expected, 3),
           match_rate=round(sum(matched) / batch, 4))  # fmt: skip
    if sampling.greedy and a is not None:
        divergence(b, target, out[0], plain_out[0], label, k, batch)


def divergence(b: Any, target: TorchEngine, spec: list[int], plain_out: list[int], label: str, k: int,
               batch: int) -> None:  # fmt: skip
    """Where the speculative and plain outputs of sequence 0 first differ, with the target's logits of
    both tokens there."""
    n = min(len(spec), len(plain_out))
    at = next((i for i in range(n) if spec[i] != plain_out[i]), None)
    row: dict[str, Any] = {"section": "divergence", "draft": label, "k": k, "batch": batch, "position": at}
    if at is not None:
        sid = 650_000
        target.add_sequence(sid, target.max_context)
        prefix = [*prompts(b, batch, target.vocab_size)[0], *spec[:at]]
        logits = target.forward([ForwardInput(sid, prefix, 1)])[0][-1].float()
        target.free(sid)
        spec_logit, plain_logit = float(logits[spec[at]]), float(logits[plain_out[at]])
        step = 2.0 ** (math.floor(math.log2(max(abs(spec_logit), abs(plain_logit), 1e-30))) - 7)  # bf16 ulp
        row.update(spec_logit=spec_logit, plain_logit=plain_logit,
                   bf16_steps=round(abs(spec_logit - plain_logit) / step, 2))  # fmt: skip
    b.emit(**row)


def suffix_spec(b: Any, target: TorchEngine, batch: int, k: int, plain_tok_s: float, plain_out: list) -> None:
    """A suffix draft on the verify graph: its own proposals, no oracle (random weights repeat little)."""
    speculative(b, target, SuffixDrafter(target.vocab_size), k, None, plain_out, plain_tok_s, "suffix")
