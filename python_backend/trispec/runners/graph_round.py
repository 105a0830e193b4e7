"""``GraphRound``: one greedy draft-verify round as CUDA-graph replays, with one device-to-host copy.

A round: reserve the KV blocks of every position it writes (the draft's fed tokens and drafts, the
target's last token and drafts); stage the inputs and upload them; replay the draft's first step (its
1-2 missing tokens) and k - 1 next steps (which advance on the device), the drafts gathered on the
device; copy them into the verify step's rows; replay the target's verify at ``max_k + 1`` rows per
sequence (``q_lens`` mask the rest); copy ``B x (2 max_k + 1)`` token ids to the host once and sync
once. Acceptance and rollback are host bookkeeping, as on the eager path.

Taken only when it is exact and cheap to be: no prompt chunk, every decode greedy with no logits
rule and no log-probs, feeding just its last verified token, ``k <= max_k``, the batch within the
largest graph, and each drafting sequence's draft cache short of 1-2 tokens (after a self-draft
took the target's keys and values). Anything else returns None and runs on the eager path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import MAX_OWN_FEED, ModelDrafter
from trispec.engine.cuda_graphs import (
    GRAPH_BATCH_SIZES,
    GraphPool,
    SeqRows,
    StepGraphs,
    advance_one,
    padded_size,
)
from trispec.engine.torch_engine import TorchEngine
from trispec.step import SeqResult, SeqStep, StepResult

# a hook for benchmarks: rewrite the drafts [B_pad, k] on the device before the verify sees them
DraftOverride = Callable[[torch.Tensor], None]


class GraphRound:
    def __init__(
        self,
        target: TorchEngine,
        drafter: ModelDrafter | None,
        *,
        max_k: int,
        sizes: Sequence[int] = GRAPH_BATCH_SIZES,
        capture: bool = True,
        attention: str | None = None,
    ) -> None:
        self.target, self.drafter = target, drafter
        self.max_k, self.sizes = max_k, tuple(sorted(sizes))
        device, K, B = target.kv.k.device, max_k, self.sizes[-1]
        pool = GraphPool()
        common = {"sizes": self.sizes, "capture": capture, "attention": attention, "pool": pool}
        # drafts in columns [0, K), the verify's argmax in [K, 2K + 1): one copy brings both back
        self.result = torch.zeros(B, 2 * K + 1, dtype=torch.int64, device=device)
        self.host_result = torch.zeros(B, 2 * K + 1, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.verify = StepGraphs(target, rows=K + 1, logits=K + 1, out_tokens=self.result[:, K:], **common)
        self.first = self.next = None
        if drafter is not None and K > 0:
            engine = drafter.engine
            assert isinstance(engine, TorchEngine)
            self.first = StepGraphs(engine, rows=MAX_OWN_FEED, logits=1, **common)
            self.next = StepGraphs(
                engine,
                rows=1,
                logits=1,
                out_tokens=self.first.buffers.out_tokens,
                block_tables=self.first.buffers.block_tables,
                prologue=advance_one(engine.block_size, engine.trash_block * engine.block_size),
                **common,
            )
        self.cuda = device.type == "cuda"
        self.draft_override: DraftOverride | None = None

    # -- which rounds -------------------------------------------------------------------------
    def ks_for(self, steps: Sequence[SeqStep], drafting_off: bool) -> list[int] | None:
        """Each sequence's k this round, or None when the round is not for the graphs. A self-draft
        first takes the target's keys and values for what it lacks."""
        if padded_size(len(steps), self.sizes) is None:
            return None
        for s in steps:
            sp = s.sampling
            if s.is_prompt_chunk or not sp.greedy or sp.shapes_logits or sp.return_log_probs:
                return None
            if len(s.token_ids) - s.num_computed != 1 or s.num_draft_tokens > self.max_k:
                return None
        drafts = self.first is not None and not drafting_off
        ks = [s.num_draft_tokens if drafts else 0 for s in steps]
        if not any(ks):
            return ks
        assert self.drafter is not None
        engine, source = self.drafter.engine, self.drafter.kv_source
        lengths = {}
        for s, k in zip(steps, ks):
            if not k:
                continue
            if s.seq_id not in engine.blocks:
                return None
            if source is not None:
                engine.import_kv(s.seq_id, source, source.cached_length(s.seq_id))
            feed = s.token_ids[engine.cached_length(s.seq_id) :]
            if not 1 <= len(feed) <= MAX_OWN_FEED:
                return None  # a catch-up: the eager path feeds it
            if max(feed) >= engine.vocab_size:  # the eager forward refuses it; on the device it would assert
                return None
            lengths[s.seq_id] = len(s.token_ids) + max(ks) - 1
        return ks if self.drafter.room_for(lengths) else None

    # -- one round ----------------------------------------------------------------------------
    def run(
        self, steps: Sequence[SeqStep], ks: Sequence[int], rollback_draft: Callable[[int, int], None]
    ) -> StepResult:
        if not self.cuda:
            return self._run(steps, ks, rollback_draft)
        with torch.cuda.device(self.result.device):  # streams and graphs on the engines' GPU
            return self._run(steps, ks, rollback_draft)

    def _run(
        self, steps: Sequence[SeqStep], ks: Sequence[int], rollback_draft: Callable[[int, int], None]
    ) -> StepResult:
        kr = max(ks, default=0)
        b_pad = padded_size(len(steps), self.sizes)
        assert b_pad is not None
        sets = [self.verify] + ([self.first, self.next] if kr else [])
        for graphs in sets:
            graphs.ensure_captured(b_pad)  # type: ignore[union-attr]
        t0 = time.perf_counter()
        self._stage(steps, ks, kr)
        events = _Clock(self.cuda)
        if kr:
            self._draft(b_pad, kr)
        events.mark()
        self.verify.run(b_pad)
        out = self.host_result[: len(steps)]
        out.copy_(self.result[: len(steps)], non_blocking=True)
        events.finish()  # the round's one sync
        rows = out.tolist()
        draft_s = events.first_part()
        results = {}
        for s, k, row in zip(steps, ks, rows):
            drafts, targets = row[:k], row[self.max_k : self.max_k + k + 1]
            n = next((i for i in range(k) if drafts[i] != targets[i]), k)
            computed = s.feed_to + n
            self.target.truncate(s.seq_id, computed)
            if kr:
                rollback_draft(s.seq_id, computed)
            results[s.seq_id] = SeqResult(s.seq_id, [*drafts[:n], targets[n]], k, n, computed)
        return StepResult(results, draft_s, time.perf_counter() - t0 - draft_s)

    def _stage(self, steps: Sequence[SeqStep], ks: Sequence[int], kr: int) -> None:
        """Reserve the blocks of every position the replays write, then stage the inputs (whole
        block-table rows, from the block managers, every round)."""
        target = self.target
        rows = []
        for s, k in zip(steps, ks):
            target.blocks.append(s.seq_id, 1 + k)
            table = target.blocks.block_table(s.seq_id)
            rows.append(SeqRows([s.token_ids[-1], *[0] * k], s.num_computed, table))
        self.verify.stage(rows)
        self.verify.upload()
        if not kr:
            return
        assert self.first is not None and self.next is not None and self.drafter is not None
        engine = self.drafter.engine
        assert isinstance(engine, TorchEngine)
        first, last = [], []
        for s, k in zip(steps, ks):
            if not k:
                first.append(SeqRows([], 0, []))
                last.append(None)
                continue
            start = engine.cached_length(s.seq_id)
            feed = s.token_ids[start:]
            engine.blocks.append(s.seq_id, len(feed) + kr - 1)
            first.append(SeqRows(feed, start, engine.blocks.block_table(s.seq_id)))
            last.append(start + len(feed) - 1)
        self.first.stage(first)
        self.next.stage_positions(last)
        self.first.upload()
        self.next.upload()

    def _draft(self, b_pad: int, kr: int) -> None:
        """k draft steps, their argmax gathered on the device, then written into the verify rows."""
        assert self.first is not None and self.next is not None
        drafts = self.result[:b_pad, :kr]
        out = self.first.buffers.out_tokens[:b_pad, 0]
        self.first.run(b_pad)
        drafts[:, 0].copy_(out)
        for i in range(1, kr):
            self.next.run(b_pad)
            drafts[:, i].copy_(out)
        if self.draft_override is not None:
            self.draft_override(drafts)
        Q = self.max_k + 1
        self.verify.buffers.tokens.view(-1, Q)[:b_pad, 1 : 1 + kr].copy_(drafts)


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
    """The graph path for these engines when it applies: the target on CUDA, and a draft that is
    none or a model on CUDA (model-free drafters run on the eager path)."""
    from trispec.drafters.none import NoDrafter

    if target.kv.k.device.type != "cuda":
        return None
    if drafter is None or isinstance(drafter, NoDrafter):
        return GraphRound(target, None, max_k=max_k)
    engine = getattr(drafter, "engine", None)
    if (
        isinstance(drafter, ModelDrafter)
        and isinstance(engine, TorchEngine)
        and engine.kv.k.device.type == "cuda"
    ):
        return GraphRound(target, drafter, max_k=max_k)
    return None
