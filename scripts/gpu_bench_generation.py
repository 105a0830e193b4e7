"""The generation sections of scripts/gpu_spec_bench.py: ``GraphRound`` driven directly (no scheduler).

* plain decoding on graphs at each batch (and eager at batch 1);
* speculative decoding, 0.5B draft -> 7B target, with an oracle of per-position acceptance ``a``: the
  draft's replays run for real (its cost is real), its proposals are then replaced on the device by the
  oracle's token, kept with probability ``a`` (else a wrong one). The oracle is **re-derived from the
  run's own verified output**: a first, untimed pass drafts from the plain run's text and records what
  the speculative run itself emits; the timed pass drafts from that. The verify's numbers depend on the
  token prefix and the batch, not on which row a token sits in, so the second pass keeps to its oracle
  past any bf16 near-tie where verify and plain decoding part (the first H100 run's k >= 4 rows broke
  there). The oracle's drafts are drawn before the timed loop (``oracle_table``): a round costs one
  gather into pinned memory and one copy. Where the timed output and plain first differ, a
  ``divergence`` row gives the position and the target's two logits there (from an eager forward of
  the speculative prefix);
* the same sampled (``temperature`` 0.7, seeded: the coupled rule on the device), and with a suffix
  draft (model-free: proposals staged with the verify rows, no draft replays).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from typing import Any

import numpy as np
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
    return [[rng.randrange(vocab) for _ in range(b.p.prompt)] for _ in range(batch)]


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
    return b.p.tokens_for(batch)


def plain(b: Any, target: TorchEngine, batch: int, sampling: SamplingParams = GREEDY) -> tuple[float, list]:
    """Plain decoding on graphs: tok/s and each sequence's output."""
    graphs = GraphRound(target, None, max_k=0, sizes=b.p.sizes, capture=b.cuda, fused=b.fused)
    gen = Generation(graphs, None, prompts(b, batch, target.vocab_size), sampling)
    try:
        gen.round(0)  # captures
        b.sync()
        t = time.perf_counter()
        while len(gen.output(0)) < tokens_for(b, batch):
            gen.round(0)
        seconds = time.perf_counter() - t
    finally:
        gen.free()
    made = sum(len(gen.output(i)) - 2 for i in range(batch))
    outputs = [gen.output(i) for i in range(batch)]
    b.emit(section="plain", path="graph", batch=batch, temperature=sampling.temperature,
           tok_s=round(made / seconds, 1), graph_mb=round(graphs.graph_bytes / 2**20, 1))  # fmt: skip
    return made / seconds, outputs


def plain_eager(b: Any, target: TorchEngine) -> None:
    sid, prompt = 600_000, prompts(b, 1, target.vocab_size)[0]
    target.add_sequence(sid, target.max_context)
    try:
        token = int(target.forward([ForwardInput(sid, prompt, 1)])[0][-1].argmax())
        n = min(b.tokens, 64)
        t = time.perf_counter()
        for _ in range(n):
            token = int(target.forward([ForwardInput(sid, [token], 1)])[0][-1].argmax())
    finally:
        target.free(sid)
    b.emit(section="plain", path="eager", batch=1, tok_s=round(n / (time.perf_counter() - t), 1))


def _oracle_run(
    b: Any, target: TorchEngine, drafter: Drafter, k: int, a: float | None, reference: list[list[int]],
    sampling: SamplingParams,
) -> tuple[float, int, int, list[list[int]]]:  # fmt: skip
    """One run at batch ``len(reference)``: seconds, tokens made, rounds, outputs. ``a`` None: the
    drafter's own proposals."""
    batch = len(reference)
    graphs = GraphRound(target, drafter, max_k=k, sizes=b.p.sizes, capture=b.cuda, fused=b.fused)
    gen = Generation(graphs, drafter, prompts(b, batch, target.vocab_size), sampling)
    staged = torch.zeros(batch, k, dtype=torch.int64, pin_memory=b.cuda)
    if a is not None:
        table = oracle_table(reference, k, a, target.vocab_size, random.Random(int(1000 * a) + k + batch))
        rows, cols, into = np.arange(batch)[:, None], np.arange(k), staged.numpy()

        def override(drafts: torch.Tensor) -> None:
            """A round's drafts: positions ``done ..`` of each sequence's table, one gather and one copy."""
            done = np.array([len(gen.output(s)) for s in range(batch)])
            into[:] = table[rows, np.minimum(done[:, None] + cols, table.shape[1] - 1)]
            drafts[:batch].copy_(staged[:, : drafts.shape[1]], non_blocking=True)

    if a is not None:
        graphs.draft_override = override
    try:
        gen.round(k)  # captures
        b.sync()
        start_tokens = sum(len(gen.output(s)) for s in range(batch))
        start_rounds = gen.rounds
        t = time.perf_counter()
        while len(gen.output(0)) < tokens_for(b, batch):
            gen.round(k)
        seconds = time.perf_counter() - t
    finally:
        gen.free()
    made = sum(len(gen.output(s)) for s in range(batch)) - start_tokens
    outputs = [gen.output(s) for s in range(batch)]
    return seconds, made, (gen.rounds - start_rounds) * batch, outputs


def oracle_table(reference: list[list[int]], k: int, a: float, vocab: int, rng: random.Random) -> np.ndarray:
    """The oracle's draft for every output position of every sequence, drawn before the timed loop:
    the reference's token, kept with probability ``a``, else another. One draw per position is one
    per draft: a round drafts positions ``done .. done + k - 1`` and its first wrong one ends it, so
    every round meets positions no round has decided on (past the reference, drafts are arbitrary)."""
    width = max(len(r) for r in reference) + k + 1
    table = np.zeros((len(reference), width), dtype=np.int64)
    for s, ref in enumerate(reference):
        for i in range(width):
            right = ref[i] if i < len(ref) else 0
            table[s, i] = right if rng.random() < a else (right + 1) % vocab
    return table


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
        try:
            prefix = [*prompts(b, batch, target.vocab_size)[0], *spec[:at]]
            logits = target.forward([ForwardInput(sid, prefix, 1)])[0][-1].float()
        finally:
            target.free(sid)
        spec_logit, plain_logit = float(logits[spec[at]]), float(logits[plain_out[at]])
        step = 2.0 ** (math.floor(math.log2(max(abs(spec_logit), abs(plain_logit), 1e-30))) - 7)  # bf16 ulp
        row.update(spec_logit=spec_logit, plain_logit=plain_logit,
                   bf16_steps=round(abs(spec_logit - plain_logit) / step, 2))  # fmt: skip
    b.emit(**row)


def suffix_spec(b: Any, target: TorchEngine, batch: int, k: int, plain_tok_s: float, plain_out: list) -> None:
    """A suffix draft on the verify graph: its own proposals, no oracle (random weights repeat little)."""
    speculative(b, target, SuffixDrafter(target.vocab_size), k, None, plain_out, plain_tok_s, "suffix")


# -- the sections (scripts/gpu_spec_bench.py), each cell guarded on its own -----------------------


def plain_greedy(b: Any, target: TorchEngine) -> dict[int, tuple[float, list]]:
    """Plain greedy decoding on graphs at every batch: {batch: (tok/s, outputs)}."""
    runs = {}
    for batch in b.p.plain_batches:
        if batch == 1 or b.time_left(30):
            run = b.section("plain", plain, b, target, batch)
            if run is not None:
                runs[batch] = run
        else:
            b.emit(section="plain", batch=batch, skipped="time budget")
    return runs


def spec_greedy(b: Any, target: TorchEngine, drafter: Drafter, plain_runs: dict) -> None:
    """The 0.5B draft with the oracle at each k and a (every a at batch 1, 0.7 beyond)."""
    for batch in b.p.batches:
        if batch not in plain_runs:
            continue
        tok_s, outputs = plain_runs[batch]
        for k in b.p.ks_at(batch):
            for a in b.p.accepts if batch == 1 else (0.7,):
                if b.time_left(15):
                    b.section("spec", speculative, b, target, drafter, k, a, outputs, tok_s, "0.5b")
                else:
                    b.emit(section="spec", draft="0.5b", batch=batch, k=k, a=a, skipped="time budget")


def suffix_greedy(b: Any, target: TorchEngine, plain_runs: dict) -> None:
    for batch in b.p.batches:
        if batch in plain_runs and b.time_left(10):
            b.section("spec", suffix_spec, b, target, batch, b.p.ks[0], *plain_runs[batch])


def self_draft(b: Any, target: TorchEngine, plain_runs: dict) -> None:
    """The 7B as its own draft (same weights, a KV pool of its own): the mechanics' ceiling."""
    from gpu_bench_plan import SELF_DRAFT_K, self_draft_tokens

    if 1 not in plain_runs or not b.time_left(20):
        b.emit(
            section="spec",
            draft="7b-self",
            skipped="no plain batch-1 run" if 1 in plain_runs else "time budget",
        )
        return
    blocks = -(-self_draft_tokens(b.p) // target.block_size)
    engine = TorchEngine(
        target.model, num_blocks=blocks, block_size=target.block_size, max_context=b.p.max_context
    )
    tok_s, outputs = plain_runs[1]
    speculative(b, target, ModelDrafter(engine), SELF_DRAFT_K, None, outputs[:1], tok_s, "7b-self", GREEDY)


def spec_sampled(b: Any, target: TorchEngine, drafter: Drafter) -> None:
    """At temperature 0.7 (seeded: the coupled rule on the device): plain, then the 0.5B draft with
    the oracle at a = 0.7, at each batch."""
    for batch in b.p.batches:
        if not b.time_left(20):
            b.emit(section="spec", draft="0.5b", batch=batch, temperature=0.7, skipped="time budget")
            continue
        run = b.section("plain", plain, b, target, batch, SAMPLED)
        if run is not None:
            b.section(
                "spec", speculative, b, target, drafter, b.p.ks[0], 0.7, run[1], run[0], "0.5b", SAMPLED
            )
