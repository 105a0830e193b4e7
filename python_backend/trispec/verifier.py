"""The target side of a round, for engines that return logits: from the target's logits over the
fed tokens and the drafts to the accepted tokens (accept.py's rule with the request's sampling)."""

from __future__ import annotations

import torch

from trispec.accept import AcceptResult, greedy_accept, speculative_accept
from trispec.drafters.base import DraftProposal
from trispec.sampling import logits_to_probs
from trispec.sampling_params import SamplingParams


def verify(
    draft: DraftProposal, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> AcceptResult:
    """``logits`` ``[k + 1, V]``: row i scores draft i, row k the bonus position."""
    if sampling.greedy:
        return greedy_accept(draft.tokens, logits)
    target_probs = logits_to_probs(logits, sampling)
    draft_probs = draft.probs if draft.probs is not None else torch.zeros(0, target_probs.shape[-1])
    return speculative_accept(draft.tokens, draft_probs, target_probs, generator)
