"""The coupled rule's perturbed argmax on CUDA, as one Triton kernel: one program per row, the row's
vocabulary in blocks; the noise from ``tl.random.philox`` with the counter layout of noise.py, so a
row gets the bits the CPU kernel gives it. Tested on the CPU under ``TRITON_INTERPRET=1`` against the
C kernel and the torch version (tests/test_keyed_noise.py)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trispec.sampling.kept_set import KeptSet
from trispec.sampling.noise import STREAM

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU path never needs it
    triton = None

BLOCK = 1024

if triton is not None:

    @triton.jit
    def _perturbed_argmax(
        scores_ptr, thresholds_ptr, ties_ptr, seeds_ptr, positions_ptr, out_ptr, V, row_stride,
        STREAM_ID: tl.constexpr, BLOCK_V: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        threshold = tl.load(thresholds_ptr + row)
        ties = tl.load(ties_ptr + row)
        seed = tl.load(seeds_ptr + row)
        position = tl.load(positions_ptr + row)
        position_lo = (position & 0xFFFFFFFF).to(tl.uint32)
        position_hi = ((position >> 32) & 0xFFFFFFFF).to(tl.uint32)
        # typed as the loop reassigns them (fp64 scores, int64 tie counts): a compiled kernel keeps a
        # loop-carried variable's type (the interpreter does not check it)
        best = tl.full((), float("-inf"), tl.float64)
        best_id = V
        first_kept = V
        seen_ties = tl.zeros((), tl.int64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            in_row = offs < V
            v = tl.load(scores_ptr + row * row_stride + offs, mask=in_row, other=float("nan"))
            at = (v == threshold) & in_row
            rank = seen_ties + tl.cumsum(at.to(tl.int64), axis=0) - 1
            kept = in_row & ((v > threshold) | (at & (rank < ties)))
            seen_ties += tl.sum(at.to(tl.int64), axis=0)
            group = (offs >> 2).to(tl.uint32)
            w0, w1, w2, w3 = tl.random.philox(
                seed, group, group * 0 + position_lo, group * 0 + position_hi, group * 0 + STREAM_ID
            )
            lane = offs & 3
            bits = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
            u = (bits.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2^-32
            score = tl.where(kept, v.to(tl.float64) - tl.log(-tl.log(u)), -float("inf"))
            block_best = tl.max(score, axis=0)
            block_id = tl.min(tl.where(kept & (score == block_best), offs, V), axis=0)
            first_kept = tl.minimum(first_kept, tl.min(tl.where(kept, offs, V), axis=0))
            best_id = tl.where(block_best > best, block_id, best_id)
            best = tl.maximum(best, block_best)
        # no finite score: the lowest kept id (-1 when nothing is kept)
        chosen = tl.where(best > -float("inf"), best_id, first_kept)
        tl.store(out_ptr + row, tl.where(chosen < V, chosen, -1))


def launch_perturbed_argmax(
    scores: torch.Tensor,
    threshold: torch.Tensor,
    ties: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Launch the kernel on device tensors and return at once: no host value read, no sync, so it can
    run inside a CUDA graph. ``scores`` float32 ``[n, V]`` (unit stride along V); ``threshold`` float32,
    ``ties``, ``seeds`` (the 64 bits of each seed) and ``positions`` int64, ``out`` int64, all ``[n]``
    and contiguous. A row that keeps nothing gets -1."""
    if triton is None:
        raise RuntimeError("the CUDA sampling kernel needs the triton package")
    n, vocab_size = scores.shape
    if n:
        _perturbed_argmax[(n,)](
            scores, threshold, ties, seeds, positions, out, vocab_size, scores.stride(0),
            STREAM_ID=STREAM, BLOCK_V=BLOCK,
        )  # fmt: skip


def seed_words(seeds: Sequence[int], device: torch.device) -> torch.Tensor:
    """Seeds (unsigned 64-bit) as the int64 tensor holding their bits."""
    return torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds], dtype=torch.int64, device=device)


def triton_perturbed_argmax(
    scaled: torch.Tensor, kept: KeptSet, seeds: Sequence[int], positions: Sequence[int]
) -> torch.Tensor:
    """``coupled.perturbed_argmax`` on the device ``scaled`` is on (CUDA, or the CPU under the
    interpreter)."""
    scores = scaled.float()
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    device = scores.device
    out = torch.empty(scores.shape[0], dtype=torch.int64, device=device)
    launch_perturbed_argmax(
        scores,
        kept.threshold.to(device=device, dtype=torch.float32).contiguous(),
        kept.ties.to(device=device, dtype=torch.int64).contiguous(),
        seed_words(seeds, device),
        torch.tensor(list(positions), dtype=torch.int64, device=device),
        out,
    )
    if bool((out < 0).any()):
        raise ValueError("a sampled row kept no token (all its logits are NaN)")
    return out
