"""Which tokens a request's top-k / top-p keep: the one definition, and the sort-free way to find it.

The definition (:func:`full_sort_kept_mask`), on a row of temperature-scaled logits ``s``:

1. order the vocabulary by ``s``, descending, equal values in ascending id order (a stable sort);
2. top-k (``0 < top_k < V``): keep the first ``top_k`` of that order;
3. top-p (``top_p < 1``): the probabilities ``p`` are the float32 softmax of the values top-k kept, in
   that order (of the whole row, in id order, without top-k); a token stays while the float64 sum of
   ``p`` over the tokens before it, added in order, is ``< top_p``: the smallest prefix whose mass
   reaches ``top_p``, and never less than the first token.

Whatever it keeps is a threshold and a tie count (:class:`KeptSet`): every token whose value is above
``threshold``, and the first ``ties`` tokens (lowest ids) whose value equals it. :func:`find_kept_sets`
finds those two numbers without sorting the vocabulary: ``torch.topk`` of the ``top_k`` values, or of
a few candidates that grow (x4) only while the nucleus does not fit in them. It sums the same
probabilities in the same order as the definition, so it keeps exactly the same tokens, ties at the
boundary included. The CPU and CUDA kernels that sample from a kept set take the two numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

try:
    from trispec.sampling import _perturbed_argmax as _kernel
except ImportError:  # built by `pip install`; torch.topk does the same, slower
    _kernel = None

# top-p candidates taken first; a row whose nucleus does not fit takes 4x more, up to the vocabulary
FIRST_CANDIDATES = 64
# up to this many, the C kernel selects them (a heap, blocks of values below it skipped); past it,
# and on CUDA, torch.topk
MAX_KERNEL_CANDIDATES = 1024


@dataclass(frozen=True)
class KeptSet:
    """Per row: tokens with a value above ``threshold`` (float32 ``[n]``), and the first ``ties``
    (int64 ``[n]``) tokens by id whose value equals it. ``candidates`` (int64 ``[n, m]``, -1 for none),
    when known, holds every token whose value is at least the threshold: a sampler need look nowhere
    else."""

    threshold: torch.Tensor
    ties: torch.Tensor
    candidates: torch.Tensor | None = None

    def mask(self, scaled: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` bool: which tokens of ``scaled`` are kept."""
        threshold = self.threshold.to(scaled.device).unsqueeze(-1)
        at = scaled == threshold
        first_ties = at & (torch.cumsum(at, dim=-1) <= self.ties.to(scaled.device).unsqueeze(-1))
        return (scaled > threshold) | first_ties


def _active_top_k(top_k: int, vocab_size: int) -> bool:
    return 0 < top_k < vocab_size


def full_sort_kept_mask(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The definition, by a full stable sort of each row: ``[n, V]`` bool of the kept tokens."""
    values, ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    keep = torch.ones_like(values, dtype=torch.bool)
    vocab_size = scaled.shape[-1]
    if _active_top_k(top_k, vocab_size):
        keep[:, top_k:] = False
    if top_p < 1.0:
        if _active_top_k(top_k, vocab_size):
            probs = torch.softmax(values[:, :top_k].contiguous(), dim=-1)
        else:
            probs = torch.softmax(scaled, dim=-1).gather(-1, ids)
        mass_before = _mass_before(probs)
        keep[:, : probs.shape[-1]] &= mass_before < top_p
    return torch.zeros_like(keep).scatter_(-1, ids, keep)


def _mass_before(probs: torch.Tensor) -> torch.Tensor:
    """float64 sum of each row's probabilities strictly before each position, added in order (a
    sequential cumsum: the same prefix sums whatever the row's length)."""
    total = torch.cumsum(probs.double(), dim=-1)
    return torch.nn.functional.pad(total[:, :-1], (1, 0))


def find_kept_sets(scaled: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float]) -> KeptSet:
    """:class:`KeptSet` of each row of ``scaled`` ``[n, V]`` under its own ``top_k[i]`` / ``top_p[i]``,
    without a sort of the vocabulary; rows with the same settings are computed together."""
    n, vocab_size = scaled.shape
    groups: dict[tuple[int, float], list[int]] = {}
    for i, (k, p) in enumerate(zip(top_k, top_p, strict=True)):
        k = k if _active_top_k(k, vocab_size) else 0
        if k or p < 1.0:
            groups.setdefault((k, p), []).append(i)
    if len(groups) == 1 and len(next(iter(groups.values()))) == n:  # one setting for all rows
        return _kept_by(scaled, *next(iter(groups)))
    threshold = torch.full((n,), -math.inf, dtype=torch.float32, device=scaled.device)
    ties = torch.full((n,), vocab_size, dtype=torch.int64, device=scaled.device)
    for (k, p), rows in groups.items():
        index = torch.tensor(rows, device=scaled.device)
        group = _kept_by(scaled[index], k, p)
        threshold[index] = group.threshold
        ties[index] = group.ties
    return KeptSet(threshold, ties)


def top_candidates(scaled: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``m`` largest values, descending, and their ids: ``torch.topk``'s values exactly
    (which of equal values' ids come with them is unspecified, for both)."""
    n, vocab_size = scaled.shape
    if _kernel is None or scaled.is_cuda or m > MAX_KERNEL_CANDIDATES or scaled.dtype != torch.float32:
        return torch.topk(scaled, m)
    rows = scaled if scaled.stride(-1) == 1 else scaled.contiguous()
    values = torch.empty(n, m, dtype=torch.float32)
    ids = torch.empty(n, m, dtype=torch.int64)
    threads = torch.get_num_threads()
    _kernel.top_values(
        rows.data_ptr(), n, vocab_size, rows.stride(0), m, values.data_ptr(), ids.data_ptr(), threads
    )
    return values, ids


def _kept_by(scaled: torch.Tensor, top_k: int, top_p: float) -> KeptSet:
    """The kept sets of rows that share ``top_k`` (0: off) and ``top_p``, with their candidates."""
    vocab_size = scaled.shape[-1]
    if top_k:
        # one candidate more than kept: when it is below the threshold, nothing outside is kept
        values, ids = top_candidates(scaled, top_k + 1)
        probs = torch.softmax(values[:, :top_k], dim=-1) if top_p < 1.0 else None
        size = _nucleus_size(probs, top_p) if probs is not None else torch.full_like(ids[:, 0], top_k)
        return _cut(values, ids, size)
    probs = torch.softmax(scaled, dim=-1)
    threshold = torch.empty_like(scaled[:, 0])
    ties = torch.empty_like(scaled[:, 0], dtype=torch.int64)
    found: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    pending = torch.arange(scaled.shape[0], device=scaled.device)
    m = min(FIRST_CANDIDATES, vocab_size)
    while pending.numel():
        values, ids = top_candidates(scaled[pending], m)
        size = _nucleus_size(probs[pending].gather(-1, ids), top_p)
        # all m candidates stay and more tokens exist: the nucleus may go on past them
        done = (size < m) | (m == vocab_size)
        kept = _cut(values[done], ids[done], size[done], whole_row=m == vocab_size)
        threshold[pending[done]], ties[pending[done]] = kept.threshold, kept.ties
        found.append((pending[done], kept.candidates))
        pending = pending[~done]
        m = min(4 * m, vocab_size)
    return KeptSet(threshold, ties, _padded(found, scaled.shape[0], m))


def _padded(found: list[tuple[torch.Tensor, torch.Tensor | None]], n: int, m: int) -> torch.Tensor | None:
    """The rows' candidates as one ``[n, widest]`` tensor padded with -1 (None if a row has none)."""
    if any(candidates is None for _, candidates in found):
        return None
    width = max(candidates.shape[1] for _, candidates in found)  # type: ignore[union-attr]
    out = torch.full((n, width), -1, dtype=torch.int64, device=found[0][0].device)
    for rows, candidates in found:
        out[rows, : candidates.shape[1]] = candidates  # type: ignore[union-attr]
    return out


def _nucleus_size(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """How many of the sorted ``probs`` stay: those whose mass before is < top_p (at least one)."""
    return (_mass_before(probs) < top_p).sum(dim=-1).clamp_(min=1)


def _cut(values: torch.Tensor, ids: torch.Tensor, size: torch.Tensor, whole_row: bool = False) -> KeptSet:
    """Keeping the first ``size`` of each row's descending ``values`` (ids ``ids``): the threshold is
    the last kept value, the ties how many of it to keep (what is above it is kept whatever the
    ties). The ids are candidates when every row's last one is below its threshold (then no token
    outside them is kept) or is the whole row."""
    threshold = values.gather(-1, (size - 1).unsqueeze(-1)).squeeze(-1)
    above = (values > threshold.unsqueeze(-1)).sum(dim=-1)
    complete = whole_row or not values.shape[0] or bool((values[:, -1] < threshold).all())
    return KeptSet(threshold, size - above, ids if complete else None)
