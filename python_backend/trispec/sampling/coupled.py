"""The coupled sampling rule (Gumbel-max coupling: Daliri, Musco, Suresh, "Coupling without
communication and drafter-invariant speculative decoding", arXiv 2408.07978).

A sampled request's token at output position t is ``argmax over kept x of s(x) + G(seed, t, x)``: s the
temperature-scaled logits after the request's rules, the kept set its top-k / top-p (kept_set.py), G
the keyed noise (noise.py). That is an exact sample of the request's distribution, and it depends on
nothing but the logits, the seed and t. A draft model proposes the same argmax over its own logits, a
model-free drafter its own token; a draft is accepted iff it equals the target's token for its row
(accept.py ``accept_matching``). The text a seed gives is then plain sampling's, whatever k, drafter or
batch; greedy is the same rule with no noise.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch

from trispec.accept import argmax_rows
from trispec.cpu_isa import isa_level
from trispec.sampling.kept_set import KeptSet, find_kept_sets
from trispec.sampling.noise import gumbel
from trispec.sampling_params import SamplingParams

try:
    from trispec.sampling import _perturbed_argmax as _kernel
except ImportError:  # built by `pip install`; absent if no C compiler was found then
    _kernel = None
    logging.getLogger(__name__).warning(
        "the C sampling kernel is not built: sampled tokens come from the (slow) torch version"
    )
_ISA = isa_level(_kernel)


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, the lowest id on ties (``accept.argmax_rows``): float32 rows on the CPU in
    the C kernel (one row split between the threads; ~0.13 ms less than numpy's right after the LM
    head, where every cache is cold), anything else through ``argmax_rows``."""
    if (
        _kernel is not None
        and hasattr(_kernel, "argmax")
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(1) == 1
        and logits.shape[1] > 0
        and (logits.shape[0] <= 1 or logits.stride(0) >= logits.shape[1])
    ):
        rows, vocab = logits.shape
        stride = logits.stride(0) if rows > 1 else vocab
        return _kernel.argmax(logits.data_ptr(), rows, vocab, stride, torch.get_num_threads(), _ISA)
    return argmax_rows(logits)


def scaled_logits(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """float32 logits divided by each row's temperature (greedy rows, T = 0, left as they are).
    Always by a tensor: CUDA divides by a Python scalar as a product with its float32 reciprocal (one
    bit off at times), the graph path (sampling/graph_sampler.py) by a tensor of temperatures; on the
    CPU both are the same true division."""
    t = torch.tensor([temp if temp > 0 else 1.0 for temp in temperatures], dtype=torch.float32)
    return logits.float() / t.to(logits.device).unsqueeze(-1)


def perturbed_argmax(
    scaled: torch.Tensor, kept: KeptSet, seeds: Sequence[int], positions: Sequence[int]
) -> torch.Tensor:
    """``[n]`` int64: for each row the kept token with the largest ``scaled + G(seed, position, .)``
    (equal scores: the lowest id). On CUDA the Triton kernel, on the CPU the C kernel; both give
    the torch version's tokens (:func:`reference_perturbed_argmax`)."""
    if scaled.is_cuda:
        from trispec.sampling.triton_argmax import triton_perturbed_argmax

        return triton_perturbed_argmax(scaled, kept, seeds, positions)
    if _kernel is None:
        return reference_perturbed_argmax(scaled, kept, seeds, positions)
    n, vocab_size = scaled.shape
    scores = scaled.float()
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    threshold = kept.threshold.float().contiguous()
    ties = kept.ties.to(torch.int64).contiguous()
    seed_words = torch.tensor([s & 0xFFFFFFFFFFFFFFFF for s in seeds], dtype=torch.uint64)
    position_words = torch.tensor(list(positions), dtype=torch.int64)
    out = torch.empty(n, dtype=torch.int64)
    candidates, width = None, 0
    if kept.candidates is not None:  # ascending ids, -1 (none) first: ties are counted in id order
        candidates = torch.sort(kept.candidates.to(torch.int64), dim=-1).values.contiguous()
        width = candidates.shape[1]
    _kernel.perturbed_argmax(
        scores.data_ptr(),
        n,
        vocab_size,
        scores.stride(0),
        threshold.data_ptr(),
        ties.data_ptr(),
        seed_words.data_ptr(),
        position_words.data_ptr(),
        out.data_ptr(),
        torch.get_num_threads(),
        _ISA,
        candidates.data_ptr() if candidates is not None else 0,
        width,
    )
    if bool((out < 0).any()):
        raise ValueError("a sampled row kept no token (all its logits are NaN)")
    return out


def reference_perturbed_argmax(
    scaled: torch.Tensor, kept: KeptSet, seeds: Sequence[int], positions: Sequence[int]
) -> torch.Tensor:
    """The same tokens from the whole vocabulary's noise, in torch: slow, for tests and for an install
    without the C kernel."""
    mask = kept.mask(scaled)
    ids = torch.arange(scaled.shape[-1])
    out = []
    for row, row_mask, seed, position in zip(scaled.float().cpu(), mask.cpu(), seeds, positions, strict=True):
        score = row.double() + gumbel(seed, position, ids)
        score = torch.where(
            row_mask & ~torch.isnan(score), score, torch.tensor(-torch.inf, dtype=torch.float64)
        )
        if not bool(row_mask.any()):
            raise ValueError("a sampled row kept no token (all its logits are NaN)")
        best = score.max()
        # equal scores (all -inf included) go to the lowest kept id
        out.append(int(torch.nonzero(row_mask & (score == best))[0]))
    return torch.tensor(out, dtype=torch.int64, device=scaled.device)


def coupled_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    positions: Sequence[int],
    skip: Collection[int] = (),
) -> list[int]:
    """Each row's token under the coupled rule: the argmax for greedy rows (lowest id on ties),
    the perturbed argmax over the kept set for sampled rows (their seeds must be set). ``logits``
    ``[n, V]`` already shaped by the request rules; ``positions`` the output position of each row;
    rows in ``skip`` are the caller's (their entry is the argmax)."""
    sampled = [i for i, p in enumerate(params) if not p.greedy and i not in skip]
    if len(sampled) == len(params):  # every row sampled: no copies of the rows
        tokens = [0] * len(params)
        rows = logits
    else:
        tokens = greedy_tokens(logits)
        if not sampled:
            return tokens
        rows = logits[torch.tensor(sampled, device=logits.device)]
    if any(params[i].seed is None for i in sampled):
        raise ValueError("the coupled rule samples with the request's seed: every sampled request needs one")
    scaled = scaled_logits(rows, [params[i].temperature for i in sampled])
    kept = find_kept_sets(scaled, [params[i].top_k for i in sampled], [params[i].top_p for i in sampled])
    seeds = [params[i].seed for i in sampled]
    chosen = perturbed_argmax(scaled, kept, seeds, [positions[i] for i in sampled]).tolist()  # type: ignore[arg-type]
    for i, token in zip(sampled, chosen):
        tokens[i] = token
    return tokens
