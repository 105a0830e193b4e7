"""Sampling transforms shared by the drafter and the target.

Speculative sampling is only lossless when the draft distribution ``q`` and the target distribution
``p`` are the distributions tokens are actually drawn from, so both go through the SAME transform
(:func:`logits_to_probs`) with the request's :class:`SamplingParams`. Greedy requests are the
``temperature == 0`` limit: a one-hot distribution on the argmax.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

from trispec.sampling_params import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request CPU generator, so a seeded request reproduces regardless of what it is batched with.

    ``None`` for greedy requests: they draw nothing. An unseeded request gets a fresh random seed from
    the OS rather than from torch's global RNG, so creating it has no side effect on other requests.
    """
    if params.greedy:
        return None
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def one_hot_probs(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """``[len(token_ids), vocab_size]`` float32 one-hot rows: the ``q`` of a deterministic drafter."""
    probs = torch.zeros(len(token_ids), vocab_size, dtype=torch.float32)
    if len(token_ids):
        probs[torch.arange(len(token_ids)), torch.as_tensor(token_ids, dtype=torch.long)] = 1.0
    return probs


def _greedy_probs(logits: torch.Tensor) -> torch.Tensor:
    # torch.argmax returns the first maximal index, so ties go to the lowest token id.
    probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return probs.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def _filter_sorted(sorted_logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) the sorted logits that top-k and then top-p drop. Input is sorted descending."""
    vocab_size = sorted_logits.shape[-1]
    if 0 < top_k < vocab_size:
        # Positional cut on the stably sorted row: exactly k survive, ties broken towards low ids.
        sorted_logits = sorted_logits.clone()
        sorted_logits[..., top_k:] = -math.inf
    if top_p < 1.0:
        # Nucleus on the distribution renormalised after top-k (the usual HF order). Keep a token
        # while the mass strictly before it is < top_p: that is the smallest prefix reaching top_p,
        # and the first token (mass before it 0) is always kept.
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        mass_before[..., 0] = 0.0
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, -math.inf)
    return sorted_logits


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[n, V]`` logits -> ``[n, V]`` float32 probabilities: temperature, top-k, top-p, renormalise.

    Greedy params give the one-hot of the argmax. Apply the same params to draft and target logits.
    """
    logits = logits.float()
    if params.greedy:
        return _greedy_probs(logits)
    scaled = logits / params.temperature
    if params.top_k == 0 and params.top_p >= 1.0:
        return torch.softmax(scaled, dim=-1)
    # A stable descending sort puts equal logits in ascending id order, which makes the top-k / top-p
    # cut deterministic on ties (torch.topk's choice among ties is unspecified).
    sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    sorted_probs = torch.softmax(_filter_sorted(sorted_logits, params.top_k, params.top_p), dim=-1)
    return torch.empty_like(sorted_probs).scatter_(-1, sorted_ids, sorted_probs)


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[n, V]`` logits -> float32 logits whose plain softmax is :func:`logits_to_probs` of a
    sampled request: divided by the temperature, -inf outside the top-k / top-p set."""
    if params.greedy:
        raise ValueError("greedy requests have no sampled distribution to express as logits")
    scaled = logits.float() / params.temperature
    if params.top_k == 0 and params.top_p >= 1.0:
        return scaled
    sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    kept = _filter_sorted(sorted_logits, params.top_k, params.top_p)
    return torch.empty_like(kept).scatter_(-1, sorted_ids, kept)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` ``[n, V]`` -> ``[n]`` int64, drawn with ``generator``.

    A one-hot row always yields its hot token, so greedy rows need no generator (``None`` would fall
    back to torch's global RNG, which only matters for non-degenerate rows).
    """
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
