"""The drafter of a runner without one: proposes nothing, so every step is plain decoding."""

from __future__ import annotations

from collections.abc import Sequence

from trispec.drafters.base import DraftProposal, DraftRequest, StatelessDrafter


class NoDrafter(StatelessDrafter):
    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        return [DraftProposal([]) for _ in requests]
