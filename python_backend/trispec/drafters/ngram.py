"""Prompt-lookup drafting: no model. Find the latest earlier occurrence of the sequence's last n
tokens and propose what followed it. Cheap; strong when the output copies from the prompt (code
edits, extraction), weak on free prose."""

from __future__ import annotations

from collections.abc import Sequence

from trispec.drafters.base import DraftProposal, DraftRequest, StatelessDrafter
from trispec.sampling import one_hot_probs


def ngram_lookup(tokens: Sequence[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of the longest suffix n-gram."""
    if k <= 0:
        return []
    n_tokens = len(tokens)
    for n in range(min(max_ngram, n_tokens - 1), min_ngram - 1, -1):
        suffix = list(tokens[n_tokens - n :])
        # search right to left so the most recent context wins
        for start in range(n_tokens - n - 1, -1, -1):
            if list(tokens[start : start + n]) == suffix:
                follow = start + n
                return list(tokens[follow : follow + k])
    return []


class NgramDrafter(StatelessDrafter):
    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            context = [*request.token_ids, *request.prefix]
            tokens = ngram_lookup(context, request.num_draft_tokens, self.max_ngram, self.min_ngram)
            probs = None
            if tokens and not request.sampling.greedy and request.sampling.rule == "rejection":
                # the rejection rule's q of a deterministic proposal: one-hot on the proposed token
                probs = one_hot_probs(tokens, self.vocab_size)
            proposals.append(DraftProposal(tokens, probs))
        return proposals
