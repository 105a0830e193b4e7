"""The target side of a round, for engines that return logits: from the target's logits over each
sequence's fed tokens and drafts to the accepted tokens.

Greedy and coupled sequences (sampling/coupled.py) have their target token chosen for every row of
the round in one batched call, then keep their drafts while they match (accept.py
``accept_matching``); rejection-rule sequences go through the p/q test one by one
(``speculative_accept``) with their own generator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trispec.accept import AcceptResult, accept_matching, speculative_accept
from trispec.drafters.base import DraftProposal
from trispec.guided.state import GuidedRows, mask_rows
from trispec.logits_rules import apply_rules, forbidding_rules, log_probs_with_alternatives
from trispec.sampling import coupled_tokens, logits_to_probs
from trispec.sampling_params import SamplingParams
from trispec.step import PromptLogProbs, SeqStep, TokenAlternatives


@dataclass(frozen=True)
class Verified:
    """One sequence's outcome of a round: its accepted tokens and, when asked for, their log-probs
    and alternatives."""

    accepted: AcceptResult
    log_probs: list[float] | None = None
    top_log_probs: list[TokenAlternatives] | None = None
    # a guided sequence given no token because the request's rules (bad_words, min_tokens,
    # logit_bias, ...) forbade every token its grammar allowed: which rules (None: the grammar
    # itself allowed nothing, or it was given tokens)
    dead_end: str | None = None


def verify_round(
    decodes: Sequence[SeqStep],
    drafts: Sequence[DraftProposal],
    logits: Sequence[torch.Tensor],
    generators: Mapping[int, torch.Generator | None],
    masks: Sequence[GuidedRows | None] | None = None,
) -> list[Verified]:
    """``logits[i]`` ``[k_i + 1, V]``: row j scores draft j of ``decodes[i]``, row k_i its bonus
    position. Returns each sequence's accepted tokens and, when its request asks for them, their
    log-probabilities under the target's distribution (and the most likely tokens beside each). A
    guided sequence's rows are masked by its grammar first (``masks[i]``, ``k_i + 1`` rows); where
    its first row allows no token it gets no token at all (the grammar ended it)."""
    guides = masks if masks is not None else [None] * len(decodes)
    shaped = [
        apply_rules(rows, s.sampling, s.token_ids, d.tokens, None if g is None else g.may_end)
        if s.sampling.shapes_logits
        else rows
        for s, d, rows, g in zip(decodes, drafts, logits, guides, strict=True)
    ]
    drafts = list(drafts)
    ended = _apply_masks(decodes, shaped, drafts, masks) if masks is not None else {}
    accepted: list[AcceptResult | None] = [None] * len(decodes)
    for i in ended:
        accepted[i] = AcceptResult(num_accepted=0, tokens=[])
    matching = [i for i, s in enumerate(decodes) if not s.sampling.samples_by_rejection and i not in ended]
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
        if i in ended:
            results.append(Verified(accepted[i], dead_end=ended[i]))
            continue
        if s.sampling.samples_by_rejection:
            probs = logits_to_probs(shaped[i], s.sampling)
            q = drafts[i].probs if drafts[i].probs is not None else torch.zeros(0, probs.shape[-1])
            accepted[i] = speculative_accept(drafts[i].tokens, q, probs, generators.get(s.seq_id))
        result = accepted[i]
        assert result is not None
        if not s.sampling.return_log_probs:
            results.append(Verified(result))
            continue
        if probs is None and not s.sampling.greedy:
            probs = logits_to_probs(shaped[i], s.sampling)
        log_probs, top = log_probs_with_alternatives(shaped[i], s.sampling, result.tokens, probs)
        results.append(Verified(result, log_probs, top))
    return results


def prompt_rows(s: SeqStep) -> int:
    """How many prompt tokens this step's feed scores for a request that asked for prompt log-probs:
    the fed positions whose next token is a prompt token (the first fed position scores token
    ``num_computed + 1``). 0 for other requests."""
    if not s.sampling.prompt_log_probs:
        return 0
    return max(0, min(s.feed_to, s.sampling.prompt_len - 1) - s.num_computed)


def score_prompt(s: SeqStep, rows: torch.Tensor) -> PromptLogProbs:
    """``rows`` ``[n, V]``: the logits at the first ``n`` fed positions -> the log-probs of the prompt
    tokens after them under the model's softmax (no temperature, rules or grammar: the prompt was not
    sampled), and their alternatives when the request asks for them."""
    n = rows.shape[0]
    first = s.num_computed + 1
    plain = SamplingParams(return_log_probs=True, top_log_probs=s.sampling.top_log_probs)
    log_probs, top = log_probs_with_alternatives(rows, plain, s.token_ids[first : first + n])
    return PromptLogProbs(first, log_probs, top)


def _apply_masks(
    decodes: Sequence[SeqStep],
    shaped: list[torch.Tensor],
    drafts: list[DraftProposal],
    masks: Sequence[GuidedRows | None],
) -> dict[int, str | None]:
    """Mask guided rows in place; returns the sequences whose first row allows nothing, each with
    the request's rules that emptied it (None: its grammar allowed nothing). A later row that allows
    nothing (a draft led the grammar into a dead end) cuts the drafts before that draft: the target
    then meets the dead end as plain decoding would, at the next round's first row."""
    ended: dict[int, str | None] = {}
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        rows = mask_rows(shaped[i], mask)
        allowed = mask.allowed.numpy()[: rows.shape[0]]
        # a row is dead where the grammar allows nothing, or the request's rules forbade all it allows
        # (without rules numpy: one small torch op per sequence costs a thread-pool wake-up on a busy
        # machine)
        ruled = decodes[i].sampling.shapes_logits
        alive = torch.isfinite(rows).any(dim=-1).tolist() if ruled else allowed.any(axis=1).tolist()
        dead = next((j for j, ok in enumerate(alive) if not ok), len(alive))
        if dead == 0:
            ended[i] = _ruled_out(decodes[i], allowed[0], mask.may_end[0]) if ruled else None
        elif dead < len(alive):
            keep = dead - 1
            probs = drafts[i].probs
            drafts[i] = DraftProposal(drafts[i].tokens[:keep], None if probs is None else probs[:keep])
            rows = rows[: keep + 1]
        shaped[i] = rows
    return ended


def _ruled_out(s: SeqStep, allowed: np.ndarray, may_end: bool) -> str | None:
    """Why a guided sequence's first row is empty when its grammar allows tokens there: the rules
    that forbade them all (None: the grammar allows nothing)."""
    tokens = allowed.nonzero()[0].tolist()
    if not tokens:
        return None
    rules = forbidding_rules(s.sampling, s.token_ids, tokens, may_end)
    verb = "forbids" if len(rules) == 1 else "forbid"
    return (
        f"no token is allowed here: {' and '.join(rules)} {verb} every token the grammar allows "
        f"({len(tokens)})"
    )
