"""``GraphRound``: one draft-verify round as CUDA-graph replays, with one device-to-host copy.

A round: catch lagging draft caches up eagerly; reserve the KV blocks of every position it writes
(the draft's fed tokens and drafts, the target's last token and drafts); stage the inputs (a
model-free drafter's proposals go straight into the verify rows) and upload them; replay the draft's
first step (its 1-2 missing tokens) and k - 1 next steps (which advance on the device), the drafts
gathered on the device; copy them into the verify step's rows; replay the target's verify at
``max_k + 1`` rows per sequence (``q_lens`` mask the rest); copy ``B x (3 max_k + 2)`` values
(drafts, the target's tokens, log-probabilities) to the host once and sync once. Acceptance and
rollback are host bookkeeping, as on the eager path.

Greedy rows take the argmax; sampled rows (the coupled rule) the perturbed argmax with their keyed
noise, chosen inside the same graphs (``sampling/graph_sampler.py``). A verify row whose top-k /
top-p set does not fit the device's fixed width comes back as -1: its sequence then emits up to the
row before, or, at its first row, runs that round eagerly (``GraphOutcome.eager``). A batch larger
than the largest graph runs as graph-sized parts. Which rounds qualify: ``graph_plan.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import MAX_OWN_FEED
from trispec.engine.base import ForwardInput
from trispec.engine.gpu.cuda_graphs import (
    GRAPH_BATCH_SIZES,
    GraphPool,
    SeqRows,
    StepGraphs,
    advance_one,
    padded_size,
)
from trispec.engine.torch_engine import TorchEngine
from trispec.runners.graph_accept import accept_rows
from trispec.runners.graph_parts import part, part_size, ranges
from trispec.runners.graph_plan import Drafters, GraphPlan, plan_round
from trispec.step import SeqResult, SeqStep, StepResult

# a hook for benchmarks: rewrite the drafts [B_pad, k] on the device before the verify sees them
DraftOverride = Callable[[torch.Tensor], None]


@dataclass
class GraphOutcome:
    result: StepResult
    # sequences whose first verify row's kept set did not fit: undo them and run their round eagerly
    eager: list[SeqStep] = field(default_factory=list)


class GraphRound:
    def __init__(
        self,
        target: TorchEngine,
        drafter: Drafter | None,
        *,
        max_k: int,
        sizes: Sequence[int] = GRAPH_BATCH_SIZES,
        capture: bool = True,
        attention: str | None = None,
        argmax_kernel: str | None = None,
        fused: bool | None = None,
    ) -> None:
        self.target = target
        self.drafters = Drafters.of(drafter)
        self.drafter = self.drafters.model
        self.max_k, self.sizes = max_k, tuple(sorted(sizes))
        device, K, B = target.kv.k.device, max_k, self.sizes[-1]
        self.pool = GraphPool()
        common = {
            "sizes": self.sizes,
            "capture": capture,
            "attention": attention,
            "pool": self.pool,
            "argmax_kernel": argmax_kernel,
            "fused": fused,  # the static step's fused kernels (None: static_step.FUSED_DEFAULT)
        }
        # drafts in columns [0, K), the verify's tokens in [K, 2K + 1), their log-probabilities (float64
        # bits) in [2K + 1, 3K + 2): one copy brings all back
        self.result = torch.zeros(B, 3 * K + 2, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self.host_result = torch.zeros(B, 3 * K + 2, dtype=torch.int64, pin_memory=pin)
        self.verify = StepGraphs(
            target,
            rows=K + 1,
            logits=K + 1,
            out_tokens=self.result[:, K : 2 * K + 1],
            out_log_probs=self.result[:, 2 * K + 1 :],
            flag_unfit=True,
            **common,
        )
        self.first = self.next = None
        # the suffix side's proposals fed to the draft model in its replays (WithSuffix)
        self.forced = torch.zeros(B, max(K, 1), dtype=torch.int64, device=device)
        self.forced_mask = torch.zeros(B, max(K, 1), dtype=torch.bool, device=device)
        self.host_forced = torch.zeros(B, max(K, 1), dtype=torch.int64, pin_memory=pin)
        self.host_forced_mask = torch.zeros(B, max(K, 1), dtype=torch.bool, pin_memory=pin)
        if self.drafter is not None and K > 0:
            engine = self.drafter.engine
            assert isinstance(engine, TorchEngine)
            self.first = StepGraphs(engine, rows=MAX_OWN_FEED, logits=1, **common)
            self.next = StepGraphs(
                engine,
                rows=1,
                logits=1,
                out_tokens=self.first.buffers.out_tokens,
                block_tables=self.first.buffers.block_tables,
                sampling=self.first.sampling,
                prologue=advance_one(engine.block_size, engine.trash_block * engine.block_size),
                advance_noise=True,
                **common,
            )
        self._forcing = False
        self.cuda = device.type == "cuda"
        self.draft_override: DraftOverride | None = None

    # -- which rounds -------------------------------------------------------------------------
    def plan(self, steps: Sequence[SeqStep], drafting_off: bool) -> GraphPlan | None:
        """The round's plan, or None when it is not for the graphs (``graph_plan.py``)."""
        return plan_round(
            steps,
            self.drafters,
            max_k=self.max_k,
            drafting_off=drafting_off,
            vocab_size=self.target.vocab_size,
        )

    @property
    def graph_bytes(self) -> int:
        """Device memory the captures took (their shared pool)."""
        return self.pool.bytes

    # -- one round ----------------------------------------------------------------------------
    def run(
        self, steps: Sequence[SeqStep], plan: GraphPlan, rollback_draft: Callable[[int, int], None]
    ) -> GraphOutcome:
        if not self.cuda:
            return self._parts(steps, plan, rollback_draft)
        with torch.cuda.device(self.result.device):  # streams and graphs on the engines' GPU
            return self._parts(steps, plan, rollback_draft)

    def _parts(
        self, steps: Sequence[SeqStep], plan: GraphPlan, rollback_draft: Callable[[int, int], None]
    ) -> GraphOutcome:
        """The round in parts of at most the largest graph's size, one after another."""
        catch_up_s, catch_up = self._catch_up(plan)
        B = part_size(self.verify, len(steps), plan.verify_mode, self.target.vocab_size)
        outcomes = [self._run(steps[i:j], part(plan, i, j), rollback_draft) for i, j in ranges(len(steps), B)]
        results = {seq: r for o in outcomes for seq, r in o.result.results.items()}
        draft_s = catch_up_s + plan.propose_s + sum(o.result.draft_time_s for o in outcomes)
        verify_s = sum(o.result.verify_time_s for o in outcomes)
        eager = [s for o in outcomes for s in o.eager]
        return GraphOutcome(StepResult(results, draft_s, verify_s, draft_catch_up_tokens=catch_up), eager)

    def _catch_up(self, plan: GraphPlan) -> tuple[float, int]:
        """Feed the lagging draft caches eagerly (one batched forward, no logits)."""
        if not plan.catch_up:
            return 0.0, 0
        assert self.drafter is not None
        t0 = time.perf_counter()
        self.drafter.engine.forward([ForwardInput(seq, tokens, 0) for seq, tokens in plan.catch_up.items()])
        return time.perf_counter() - t0, sum(len(t) for t in plan.catch_up.values())

    def _run(
        self, steps: Sequence[SeqStep], plan: GraphPlan, rollback_draft: Callable[[int, int], None]
    ) -> GraphOutcome:
        kr = plan.replays if self.first is not None else 0
        b_pad = padded_size(len(steps), self.sizes)
        assert b_pad is not None
        self.verify.ensure_captured(b_pad, plan.verify_mode)
        if kr:
            assert self.first is not None and self.next is not None
            self.first.ensure_captured(b_pad, plan.draft_mode)
            self.next.ensure_captured(b_pad, plan.draft_mode)
        t0 = time.perf_counter()
        self._stage(steps, plan, kr)
        events = _Clock(self.cuda)
        if kr:
            self._draft(b_pad, kr, plan)
        events.mark()
        self.verify.run(b_pad, plan.verify_mode)
        out = self.host_result[: len(steps)]
        out.copy_(self.result[: len(steps)], non_blocking=True)
        events.finish()  # the round's one sync
        rows = out.tolist()
        log_probs = None
        if plan.verify_mode.log_probs:
            log_probs = out[:, 2 * self.max_k + 1 :].view(torch.float64).tolist()
        draft_s = events.first_part()
        kept, eager = accept_rows(steps, plan, rows, log_probs, self.max_k)
        results = {}
        for s in steps:
            if (a := kept.get(s.seq_id)) is None:
                continue
            computed = s.feed_to + a.num_accepted
            self.target.truncate(s.seq_id, computed)
            rollback_draft(s.seq_id, computed)
            results[s.seq_id] = SeqResult(
                s.seq_id, a.tokens, a.num_drafted, a.num_accepted, computed, log_probs=a.log_probs
            )
        return GraphOutcome(StepResult(results, draft_s, time.perf_counter() - t0 - draft_s), eager)

    def _stage(self, steps: Sequence[SeqStep], plan: GraphPlan, kr: int) -> None:
        """Reserve the blocks of every position the replays write, then stage the inputs (whole
        block-table rows, from the block managers, every round)."""
        target = self.target
        rows = []
        for s, k, proposal in zip(steps, plan.ks, plan.proposals):
            target.blocks.append(s.seq_id, 1 + k)
            table = target.blocks.block_table(s.seq_id)
            drafts = proposal if proposal is not None else [0] * k
            rows.append(SeqRows([s.token_ids[-1], *drafts], s.num_computed, table))
        self.verify.stage(rows)
        sampled = not plan.verify_mode.greedy
        if sampled:
            self.verify.stage_sampling([(s.sampling, _output_position(s)) for s in steps])
        self.verify.upload(sampling=sampled)
        if not kr:
            return
        assert self.first is not None and self.next is not None and self.drafter is not None
        engine = self.drafter.engine
        assert isinstance(engine, TorchEngine)
        first, last, forced = [], [], False
        self.host_forced_mask.zero_()
        for b, (s, k, replayed, proposal) in enumerate(zip(steps, plan.ks, plan.model, plan.proposals)):
            if not replayed:
                first.append(SeqRows([], 0, []))
                last.append(None)
                continue
            start = engine.cached_length(s.seq_id)
            feed = s.token_ids[start:]
            engine.blocks.append(s.seq_id, len(feed) + k - 1)  # its own drafts (graph_plan.py)
            first.append(SeqRows(feed, start, engine.blocks.block_table(s.seq_id)))
            last.append(start + len(feed) - 1)
            if proposal:
                self.host_forced[b, : len(proposal)] = torch.tensor(proposal)
                self.host_forced_mask[b, : len(proposal)] = True
                forced = True
        self.first.stage(first)
        self.next.stage_positions(last)
        sampled = not plan.draft_mode.greedy
        if sampled:
            self.first.stage_sampling(
                [(s.sampling, _output_position(s)) if m else None for s, m in zip(steps, plan.model)]
            )
        self.first.upload(sampling=sampled)
        self.next.upload()
        self._forcing = forced
        if forced:
            self.forced.copy_(self.host_forced, non_blocking=True)
            self.forced_mask.copy_(self.host_forced_mask, non_blocking=True)

    def _draft(self, b_pad: int, kr: int, plan: GraphPlan) -> None:
        """k draft steps, their tokens gathered on the device (a sequence with a proposal of its own
        is fed that instead), then written into the verify rows."""
        assert self.first is not None and self.next is not None
        drafts = self.result[:b_pad, :kr]
        out = self.first.buffers.out_tokens[:b_pad, 0]
        for i in range(kr):
            (self.first if i == 0 else self.next).run(b_pad, plan.draft_mode)
            if self._forcing:
                out.copy_(torch.where(self.forced_mask[:b_pad, i], self.forced[:b_pad, i], out))
            drafts[:, i].copy_(out)
        if self.draft_override is not None:
            self.draft_override(drafts)
        Q = self.max_k + 1
        self.verify.buffers.tokens.view(-1, Q)[:b_pad, 1 : 1 + kr].copy_(drafts)


def _output_position(s: SeqStep) -> int:
    """The output position of the token after the sequence's last verified one (the keyed noise's)."""
    return len(s.token_ids) - s.sampling.prompt_len


class _Clock:
    """The draft part's time and the round's end: CUDA events on a GPU (read after the one sync,
    so no sync of their own), the host clock elsewhere (where every op has finished on return)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        if cuda:
            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            self.events[0].record()
        self.t0 = time.perf_counter()
        self.t1 = self.t0

    def mark(self) -> None:
        if self.cuda:
            self.events[1].record()
        self.t1 = time.perf_counter()

    def finish(self) -> None:
        if self.cuda:
            torch.cuda.current_stream().synchronize()

    def first_part(self) -> float:
        if self.cuda:
            return self.events[0].elapsed_time(self.events[1]) / 1e3
        return self.t1 - self.t0


def graph_round_for(target: TorchEngine, drafter: Drafter | None, max_k: int) -> GraphRound | None:
    """The graph path for these engines when it applies: the target on CUDA, and a draft model (if
    any) on CUDA too. Model-free drafters (n-gram, suffix) propose on the host for it."""
    if target.kv.k.device.type != "cuda":
        return None
    model = Drafters.of(drafter).model
    if model is not None:
        engine = model.engine
        if not isinstance(engine, TorchEngine) or engine.kv.k.device.type != "cuda":
            return None
    return GraphRound(target, drafter, max_k=max_k)
