"""The guided side of ``TorchSpecRunner``: each guided sequence's grammar state, the tokens the grammar
forces proposed as free drafts ahead of the drafter's, drafts cut to what the grammar allows, and the
masks of every verify row (guided/state.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trispec.drafters.base import DraftProposal
from trispec.guided.state import GrammarState, GuidedRows
from trispec.sampling.probs import one_hot_probs
from trispec.step import SeqStep


class GuidedSide:
    """Mixed into ``TorchSpecRunner``, whose state it uses."""

    _grammars: dict[int, GrammarState]
    # the grammar's forced tokens are drafted (speculation.grammar_drafts); off: the drafter alone
    grammar_drafts: bool

    @property
    def vocab_size(self) -> int: ...

    def _grammar_states(self, decodes: Sequence[SeqStep]) -> list[GrammarState | None]:
        """Each decode's grammar, caught up with its verified tokens (None when it is not guided)."""
        states: list[GrammarState | None] = []
        for s in decodes:
            compiled = s.sampling.grammar
            if compiled is None:
                states.append(None)
                continue
            state = self._grammars.get(s.seq_id)
            if state is None or state.compiled is not compiled:
                sampling = s.sampling
                state = GrammarState(compiled, sampling.end_ids, sampling.prompt_len, self.vocab_size)
                self._grammars[s.seq_id] = state
            state.sync(s.token_ids)
            states.append(state)
        return states

    def _forced_drafts(
        self, decodes: Sequence[SeqStep], states: Sequence[GrammarState | None]
    ) -> list[list[int]]:
        """The tokens each guided sequence's grammar forces next, within its k (none for k = 0)."""
        return [
            state.forced(s.num_draft_tokens) if state is not None and self.grammar_drafts else []
            for s, state in zip(decodes, states)
        ]

    def _guided_round(
        self,
        decodes: Sequence[SeqStep],
        states: Sequence[GrammarState | None],
        forced: Sequence[list[int]],
        proposals: list[DraftProposal],
    ) -> tuple[list[DraftProposal], list[GuidedRows | None]]:
        """Forced tokens ahead of each drafter proposal, cut where the grammar stops allowing them,
        and every verify row's mask."""
        masks: list[GuidedRows | None] = []
        for i, (s, state) in enumerate(zip(decodes, states)):
            if state is None:
                masks.append(None)
                continue
            proposal = proposals[i]
            tokens = [*forced[i], *proposal.tokens]
            probs = proposal.probs
            if forced[i] and s.sampling.samples_by_rejection:
                # a deterministic proposal's q under the rejection rule: one-hot on each forced token
                head = one_hot_probs(forced[i], self.vocab_size)
                probs = head if probs is None else torch.cat([head, probs])
            n, mask = state.check_drafts(tokens)
            kept = None if probs is None else probs[:n]
            proposals[i] = DraftProposal(tokens[:n], kept, proposal.catch_up_tokens)
            masks.append(mask)
        return proposals, masks

    def _drop_grammar(self, seq_id: int) -> None:
        self._grammars.pop(seq_id, None)
