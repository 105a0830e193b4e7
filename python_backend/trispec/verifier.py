"""The target side of a round: score every sequence's drafts in ONE batched forward and apply the
accept rule per sequence.

``Verifier`` is the seam for engines that verify by themselves: ``LogitsVerifier`` gets logits from
any ``Engine`` and applies our accept rule; a TensorRT-LLM executor, which takes external draft tokens
and returns the accepted ones, implements the same protocol and returns ``AcceptResult`` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from trispec.accept import AcceptResult, greedy_accept, speculative_accept
from trispec.drafters.base import DraftProposal
from trispec.engine.base import Engine, ForwardInput, KVUsage
from trispec.sampling import SamplingParams, logits_to_probs


@dataclass(frozen=True)
class VerifyInput:
    seq_id: int
    # verified tokens the target cache does not hold yet (the last emitted token; the whole
    # remaining prompt tail on a sequence's first round)
    pending_tokens: Sequence[int]
    draft: DraftProposal
    sampling: SamplingParams
    generator: torch.Generator | None


class Verifier(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def max_context(self) -> int: ...

    def can_admit(self, max_length: int) -> bool: ...

    def add_sequence(self, seq_id: int, max_length: int) -> None: ...

    def verify(
        self, items: Sequence[VerifyInput], prefill: Sequence[ForwardInput] = ()
    ) -> list[AcceptResult]:
        """Verify all items (and feed prompt chunks) in one batched target pass; the target cache
        keeps exactly the verified tokens afterwards (rejected drafts are rolled back)."""
        ...

    def rollback(self, seq_id: int, num_verified: int) -> None:
        """Undo a failed verify: forget anything cached past the first ``num_verified`` tokens."""
        ...

    def free(self, seq_id: int) -> None: ...

    def kv_usage(self) -> KVUsage: ...


class LogitsVerifier:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def max_context(self) -> int:
        return self.engine.max_context

    def can_admit(self, max_length: int) -> bool:
        return self.engine.can_reserve(max_length)

    def add_sequence(self, seq_id: int, max_length: int) -> None:
        self.engine.add_sequence(seq_id, max_length)

    def verify(
        self, items: Sequence[VerifyInput], prefill: Sequence[ForwardInput] = ()
    ) -> list[AcceptResult]:
        cached_before = [self.engine.cached_length(item.seq_id) for item in items]
        inputs = [
            ForwardInput(item.seq_id, [*item.pending_tokens, *item.draft.tokens], len(item.draft.tokens) + 1)
            for item in items
        ]
        logits = self.engine.forward([*inputs, *prefill])[: len(items)]
        results = []
        for item, rows, before in zip(items, logits, cached_before):
            result = self._accept(item, rows)
            # keep the pending tokens and the accepted drafts; the target's own token is fed next round
            self.engine.truncate(item.seq_id, before + len(item.pending_tokens) + result.num_accepted)
            results.append(result)
        return results

    @staticmethod
    def _accept(item: VerifyInput, logits: torch.Tensor) -> AcceptResult:
        if item.sampling.greedy:
            return greedy_accept(item.draft.tokens, logits)
        target_probs = logits_to_probs(logits, item.sampling)
        draft_probs = item.draft.probs
        if draft_probs is None:
            draft_probs = torch.zeros(0, target_probs.shape[-1])
        return speculative_accept(item.draft.tokens, draft_probs, target_probs, item.generator)

    def rollback(self, seq_id: int, num_verified: int) -> None:
        if self.engine.cached_length(seq_id) > num_verified:
            self.engine.truncate(seq_id, num_verified)

    def free(self, seq_id: int) -> None:
        self.engine.free(seq_id)

    def kv_usage(self) -> KVUsage:
        return self.engine.kv_usage()
