"""The target side of a round, for engines that return logits: from the target's logits over each
sequence's fed tokens and drafts to the accepted tokens.

Greedy and coupled sequences (sampling/coupled.py) have their target token chosen for every row of
the round in one batched call, then keep their drafts while they match (accept.py
``accept_matching``); rejection-rule sequences go through the p/q test one by one
(``speculative_accept``) with their own generator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from trispec.accept import AcceptResult, accept_matching, speculative_accept
from trispec.drafters.base import DraftProposal
from trispec.logits_rules import apply_rules, log_probs_of
from trispec.sampling import coupled_tokens, logits_to_probs
from trispec.step import SeqStep


def verify_round(
    decodes: Sequence[SeqStep],
    drafts: Sequence[DraftProposal],
    logits: Sequence[torch.Tensor],
    generators: Mapping[int, torch.Generator | None],
) -> list[tuple[AcceptResult, list[float] | None]]:
    """``logits[i]`` ``[k_i + 1, V]``: row j scores draft j of ``decodes[i]``, row k_i its bonus
    position. Returns each sequence's accepted tokens and, when its request asks for them, their
    log-probabilities under the target's distribution."""
    shaped = [
        apply_rules(rows, s.sampling, s.token_ids, d.tokens) if s.sampling.shapes_logits else rows
        for s, d, rows in zip(decodes, drafts, logits, strict=True)
    ]
    accepted: list[AcceptResult | None] = [None] * len(decodes)
    matching = [i for i, s in enumerate(decodes) if not s.sampling.samples_by_rejection]
    if matching:
        params, positions = [], []
        for i in matching:
            first = len(decodes[i].token_ids) - decodes[i].sampling.prompt_len
            rows = shaped[i].shape[0]
            params += [decodes[i].sampling] * rows
            positions += range(first, first + rows)
        # one sequence (a plain decode step): its rows as they are, not a copy of a vocabulary's logits
        rows = shaped[matching[0]] if len(matching) == 1 else torch.cat([shaped[i] for i in matching])
        tokens = coupled_tokens(rows, params, positions)
        start = 0
        for i in matching:
            end = start + shaped[i].shape[0]
            accepted[i] = accept_matching(drafts[i].tokens, tokens[start:end])
            start = end
    results = []
    for i, s in enumerate(decodes):
        probs = None
        if s.sampling.samples_by_rejection:
            probs = logits_to_probs(shaped[i], s.sampling)
            q = drafts[i].probs if drafts[i].probs is not None else torch.zeros(0, probs.shape[-1])
            accepted[i] = speculative_accept(drafts[i].tokens, q, probs, generators.get(s.seq_id))
        result = accepted[i]
        assert result is not None
        if not s.sampling.return_log_probs:
            results.append((result, None))
            continue
        if probs is None and not s.sampling.greedy:
            probs = logits_to_probs(shaped[i], s.sampling)
        results.append((result, log_probs_of(shaped[i], s.sampling, result.tokens, probs)))
    return results
