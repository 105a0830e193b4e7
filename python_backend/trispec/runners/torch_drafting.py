"""The drafting side of ``TorchSpecRunner``: what the drafter is asked for each step, how much the
draft model's KV can hold, and what happens when the drafter fails (that step decodes plain; after
MAX_DRAFT_FAILURES_IN_A_ROW such steps drafting is off for the process)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from trispec.drafters.base import Drafter, DraftProposal, DraftRequest
from trispec.drafters.prediction import PredictionDrafts
from trispec.engine.kv_cache import blocks_for
from trispec.guided.state import GrammarState
from trispec.step import SeqStep

logger = logging.getLogger(__name__)

MAX_DRAFT_FAILURES_IN_A_ROW = 3


class DraftSide:
    """Mixed into ``TorchSpecRunner``, whose state it uses."""

    drafter: Drafter
    predictions: PredictionDrafts
    drafting_off: bool
    _generators: dict[int, torch.Generator | None]
    _drafting: set[int]  # registered with the drafter
    _draft_failures_in_a_row: int

    def _seeded_drafts_fit(self, steps: Sequence[SeqStep]) -> bool:
        """A sequence whose output depends on its drafts (rejection rule, seeded) must draft its k
        whatever it shares (see ``_draft_room``): its drafts must fit the draft pool with every other
        draft cache dropped."""
        usage = self.drafter.kv_usage()
        if usage is None or self.drafting_off:
            return True
        need = sum(
            blocks_for(len(s.token_ids) + s.num_draft_tokens - 1, usage.block_size)
            for s in steps
            if s.num_draft_tokens and s.sampling.output_depends_on_drafts and not s.is_prompt_chunk
        )
        return need <= usage.total_blocks

    def _draft(
        self,
        decodes: Sequence[SeqStep],
        forced: Sequence[Sequence[int]] | None = None,
        guides: Sequence[GrammarState | None] | None = None,
    ) -> tuple[list[DraftProposal], bool]:
        """Each decode's proposal (empty for k = 0), and whether the drafter failed this step. A guided
        decode's drafter continues after the tokens its grammar forces (``forced``), under its grammar
        (``guides``); the proposal holds the drafter's tokens only."""
        forced = forced or [()] * len(decodes)
        guides = guides or [None] * len(decodes)
        proposals = [DraftProposal([]) for _ in decodes]
        drafting = [
            i for i, s in enumerate(decodes) if s.num_draft_tokens > len(forced[i]) and not self.drafting_off
        ]

        def request(i: int) -> DraftRequest:
            s = decodes[i]
            k = s.num_draft_tokens - len(forced[i])
            generator = self._generators[s.seq_id]
            return DraftRequest(s.seq_id, s.token_ids, k, s.sampling, generator, tuple(forced[i]), guides[i])

        # a request with a prediction drafts from it alone: no draft model, no room in its pool
        for i in [i for i in drafting if decodes[i].sampling.prediction]:
            proposals[i] = self.predictions.propose(request(i))
        drafting = [i for i in drafting if not decodes[i].sampling.prediction]
        drafting = self._draft_room(decodes, drafting)
        if not drafting:
            return proposals, False
        requests = [request(i) for i in drafting]
        try:
            proposed = self.drafter.propose(requests)
        except Exception as exc:
            self._draft_failed(exc, len(requests))
            return proposals, True
        self._draft_failures_in_a_row = 0
        for i, proposal in zip(drafting, proposed):
            proposals[i] = proposal
        return proposals, False

    def _draft_room(self, decodes: Sequence[SeqStep], drafting: list[int]) -> list[int]:
        """The drafting sequences the draft model's KV can hold this step. When it cannot hold them
        all, the caches of sequences not drafting now are dropped (they catch up when they next
        draft), then sequences decode plain this step, newest first; those whose output depends on
        their drafts (rejection rule, seeded) last of all, and others' caches are dropped to make room
        for them (``room_for`` made sure they fit)."""
        if not drafting:
            return drafting

        def grows_to(i: int) -> tuple[int, int]:  # the draft cache after proposing k tokens
            s = decodes[i]
            return s.seq_id, len(s.token_ids) + s.num_draft_tokens - 1

        if self.drafter.room_for(dict(map(grows_to, drafting))):
            return drafting
        now = {decodes[i].seq_id for i in drafting}
        for seq_id in self._drafting - now:
            self._rollback_draft(seq_id, 0)
        order = sorted(
            drafting, key=lambda i: (not decodes[i].sampling.output_depends_on_drafts, decodes[i].seq_id)
        )
        kept: list[int] = []
        lengths: dict[int, int] = {}
        for n, i in enumerate(order):
            seq_id, length = grows_to(i)
            fits = self.drafter.room_for({**lengths, seq_id: length})
            if not fits and decodes[i].sampling.output_depends_on_drafts:
                for j in order[n + 1 :]:
                    if not decodes[j].sampling.output_depends_on_drafts:
                        self._rollback_draft(decodes[j].seq_id, 0)
                fits = self.drafter.room_for({**lengths, seq_id: length})
            if fits:
                lengths[seq_id] = length
                kept.append(i)
        return sorted(kept)

    def _draft_failed(self, exc: BaseException, num_sequences: int) -> None:
        self._draft_failures_in_a_row += 1
        logger.warning("the drafter failed (%r): %d sequences decode plain this step", exc, num_sequences)
        if self._draft_failures_in_a_row >= MAX_DRAFT_FAILURES_IN_A_ROW:
            self._drafting_off(f"the drafter failed {self._draft_failures_in_a_row} steps in a row")

    def _drafting_off(self, why: str) -> None:
        if not self.drafting_off:
            self.drafting_off = True
            logger.error("%s: drafting is off until the process restarts", why)

    def _draft_lengths(self, steps: Sequence[SeqStep]) -> dict[int, int]:
        """What the draft cache of each step's sequence holds now (for an undo of the round)."""
        if self.drafting_off:
            return {}
        return {s.seq_id: self.drafter.cached_length(s.seq_id) for s in steps if s.seq_id in self._drafting}

    def _rollback_draft(self, seq_id: int, num_verified: int) -> None:
        """Cut a sequence's draft cache back to its verified tokens. A draft cache that cannot be
        fixed is of no use: drafting goes off rather than failing the target's work."""
        if seq_id not in self._drafting or self.drafting_off:
            return
        try:
            self.drafter.rollback(seq_id, num_verified)
        except Exception as exc:
            self._drafting_off(f"the drafter could not roll back sequence {seq_id} ({exc!r})")
