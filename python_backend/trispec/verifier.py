"""The target side of a round, for engines that return logits: from the target's logits over the
fed tokens and the drafts to the accepted tokens (accept.py's rule with the request's sampling)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trispec.accept import AcceptResult, greedy_accept, speculative_accept
from trispec.drafters.base import DraftProposal
from trispec.logits_rules import apply_rules, log_probs_of
from trispec.sampling import logits_to_probs
from trispec.sampling_params import SamplingParams


def verify(
    draft: DraftProposal,
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
    context: Sequence[int] = (),
) -> tuple[AcceptResult, list[float] | None]:
    """``logits`` ``[k + 1, V]``: row i scores draft i, row k the bonus position; ``context`` is the
    sequence's verified tokens (the rows follow it). Returns the accepted tokens and, when the
    request asks for them, their log-probabilities under the target's distribution."""
    if sampling.shapes_logits:  # the drafter shaped its q the same way (logits_rules.py)
        logits = apply_rules(logits, sampling, context, draft.tokens)
    if sampling.greedy:
        accepted = greedy_accept(draft.tokens, logits)
        target_probs = None
    else:
        target_probs = logits_to_probs(logits, sampling)
        draft_probs = draft.probs if draft.probs is not None else torch.zeros(0, target_probs.shape[-1])
        accepted = speculative_accept(draft.tokens, draft_probs, target_probs, generator)
    if not sampling.return_log_probs:
        return accepted, None
    return accepted, log_probs_of(logits, sampling, accepted.tokens, target_probs)
