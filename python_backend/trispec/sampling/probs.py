"""Distributions, for what still needs them: the rejection rule (``speculation.sampling_rule:
rejection``), log-probabilities, and the draft logits TensorRT-LLM's acceptance reads.

Speculative sampling by rejection is only lossless when the draft distribution ``q`` and the target
distribution ``p`` are the distributions tokens are actually drawn from, so both go through the SAME
transform (:func:`logits_to_probs`) with the request's :class:`SamplingParams`. Greedy requests are
the ``temperature == 0`` limit: a one-hot distribution on the argmax. What top-k / top-p keep is
kept_set.py's, found without sorting the vocabulary.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import torch

from trispec.sampling.coupled import scaled_logits
from trispec.sampling.kept_set import find_kept_sets
from trispec.sampling_params import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A per-request CPU generator for the rejection rule, so a seeded request reproduces regardless
    of what it is batched with.

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


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[n, V]`` logits -> float32 logits whose plain softmax is :func:`logits_to_probs` of a
    sampled request: divided by the temperature, -inf outside the top-k / top-p set."""
    if params.greedy:
        raise ValueError("greedy requests have no sampled distribution to express as logits")
    scaled = scaled_logits(logits, [params.temperature] * logits.shape[0])
    if params.top_k == 0 and params.top_p >= 1.0:
        return scaled
    n = scaled.shape[0]
    kept = find_kept_sets(scaled, [params.top_k] * n, [params.top_p] * n)
    return scaled.masked_fill(~kept.mask(scaled), -math.inf)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[n, V]`` logits -> ``[n, V]`` float32 probabilities: temperature, top-k, top-p, renormalise.

    Greedy params give the one-hot of the argmax. Apply the same params to draft and target logits.
    """
    if params.greedy:
        return _greedy_probs(logits.float())
    return torch.softmax(filtered_logits(logits, params), dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs`` ``[n, V]`` -> ``[n]`` int64, drawn with ``generator``.

    A one-hot row always yields its hot token, so greedy rows need no generator (``None`` would fall
    back to torch's global RNG, which only matters for non-degenerate rows).
    """
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
