"""Accept/reject rules: which draft tokens the target keeps, plus the one token the target adds.

Every rule emits ``num_accepted + 1`` tokens: the accepted draft prefix, then either the target's
correction at the first rejected position or, when every draft was accepted, a bonus token from the
target after the last draft. ``k == 0`` is plain decoding.

:func:`accept_matching` is the rule for targets whose token at each row is already chosen: greedy
(the argmax) and the coupled sampling rule (the perturbed argmax with the request's keyed noise,
sampling/coupled.py). A draft is kept while it equals the target's token for its row; the output is
then the target's own, token for token, whatever was drafted.

:func:`speculative_accept` is the rejection rule (Leviathan et al. 2023, Chen et al. 2023): the
emitted tokens are distributed exactly as if sampled from the target ``p`` one at a time, whatever
the draft distribution ``q`` was, as long as each draft token really was drawn from its ``q`` row;
which tokens a seed gives depends on the drafts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AcceptResult:
    num_accepted: int  # accepted draft tokens, 0..k
    tokens: list[int]  # accepted drafts + exactly one target token (len == num_accepted + 1)


def _check_rows(name: str, tensor: torch.Tensor, rows: int, vocab_size: int | None = None) -> None:
    if tensor.dim() != 2 or tensor.shape[0] != rows:
        raise ValueError(f"{name}: expected shape [{rows}, V], got {list(tensor.shape)}")
    if vocab_size is not None and tensor.shape[1] != vocab_size:
        raise ValueError(f"{name}: vocab size {tensor.shape[1]} != {vocab_size}")


def _check_tokens(draft_tokens: Sequence[int], vocab_size: int) -> None:
    for token in draft_tokens:
        if not 0 <= token < vocab_size:
            raise ValueError(f"draft token {token} outside vocab [0, {vocab_size})")


def _first_false(flags: list[bool]) -> int:
    """Index of the first False (``len(flags)`` when all are True): the length of the accepted prefix."""
    return next((i for i, ok in enumerate(flags) if not ok), len(flags))


def accept_matching(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> AcceptResult:
    """Keep drafts while they equal the target's token for their row, then the target's token at the
    first mismatch (or its bonus token, row k). ``target_tokens`` has ``k + 1`` entries."""
    drafts = [int(t) for t in draft_tokens]
    targets = [int(t) for t in target_tokens]
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"target_tokens: expected {len(drafts) + 1} tokens, got {len(targets)}")
    n = _first_false([draft == target for draft, target in zip(drafts, targets, strict=False)])
    return AcceptResult(num_accepted=n, tokens=[*drafts[:n], targets[n]])


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, the lowest id on ties (as torch.argmax). float32 rows on the CPU go through
    numpy: torch's argmax over a 151,936-token row took ~0.45 ms (a parallel reduction's wake-up),
    numpy's ~0.02 ms warm. The serving path's greedy tokens come from ``sampling.coupled.greedy_tokens``
    (a C argmax), which falls back to this where its kernel is not built."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        rows = logits.detach() if logits.requires_grad else logits
        return rows.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def greedy_accept(draft_tokens: Sequence[int], target_logits: torch.Tensor) -> AcceptResult:
    """Keep drafts while they equal the target argmax; then append the target argmax at the stop.

    ``target_logits`` is ``[k+1, V]``: row ``i`` scores the position of ``draft_tokens[i]``, row ``k``
    is the bonus position. Ties go to the lowest id (torch.argmax), matching greedy ``logits_to_probs``.
    """
    drafts = [int(t) for t in draft_tokens]  # also accepts a tensor of ids
    k = len(drafts)
    _check_rows("target_logits", target_logits, k + 1)
    _check_tokens(drafts, target_logits.shape[1])
    # One argmax over all rows, then plain Python: k is small and .tolist() avoids k tensor syncs.
    return accept_matching(drafts, argmax_rows(target_logits))


def _residual_weights(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalised ``max(0, p - q)``, or ``p`` when that is all zeros (see residual_distribution)."""
    residual = (p - q).clamp_(min=0.0)
    total = float(residual.sum())
    return residual if 0.0 < total < math.inf else p  # the comparison also rejects NaN


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(0, p - q))``: what to sample from after rejecting a draft from ``q`` against ``p``.

    The residual is all zeros only when ``p <= q`` everywhere, i.e. ``p == q`` up to rounding; then a
    rejection can only come from rounding or a draft ``q`` could not have produced, and ``p`` itself is
    the right distribution to fall back to (it is also what the residual tends to as ``q -> p``).
    """
    weights = _residual_weights(p, q)
    return weights / weights.sum()


def speculative_accept(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> AcceptResult:
    """Lossless speculative sampling for one sequence.

    ``draft_probs`` (q) ``[k, V]`` are the distributions the drafts were drawn from (one-hot rows for a
    deterministic drafter); ``target_probs`` (p) ``[k+1, V]``, both already through ``logits_to_probs``
    with the same params. Draft ``i`` is accepted with probability ``min(1, p_i[x_i] / q_i[x_i])``; the
    first rejection emits a sample from ``norm(max(0, p_i - q_i))``, and if all ``k`` are accepted a
    bonus token is sampled from ``p_k``. Every random draw uses ``generator``, so a seeded request
    reproduces exactly.
    """
    drafts = [int(t) for t in draft_tokens]  # also accepts a tensor of ids
    k = len(drafts)
    _check_rows("target_probs", target_probs, k + 1)
    vocab_size = target_probs.shape[1]
    _check_rows("draft_probs", draft_probs, k, vocab_size)
    _check_tokens(drafts, vocab_size)

    n = 0
    if k > 0:
        # Pull the k probabilities out as Python floats (exact doubles of the float32 values). The
        # [k, 1] index gathers from rows 0..k-1 of p, so the bonus row needs no slicing away.
        ids = torch.tensor([[x] for x in drafts])
        p_x = target_probs.gather(1, ids).view(k).tolist()
        q_x = draft_probs.gather(1, ids).view(k).tolist()
        # All k uniforms in one draw, so the generator advances the same way whatever gets accepted.
        # u < p/q is tested as u*q < p: no division, and p >= q accepts for every u in [0, 1). A draft
        # with q == 0 could not have come from q, so it is rejected rather than waved through.
        u = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
        n = _first_false([q > 0 and ui * q < p for ui, p, q in zip(u, p_x, q_x, strict=True)])

    # torch.multinomial normalises its input, so the residual is sampled without dividing it first.
    weights = _residual_weights(target_probs[n], draft_probs[n]) if n < k else target_probs[k]
    last = int(torch.multinomial(weights, 1, generator=generator))
    return AcceptResult(num_accepted=n, tokens=[*drafts[:n], last])
