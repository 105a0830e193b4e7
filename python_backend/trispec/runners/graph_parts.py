"""How a graph round is cut into parts: a batch larger than the largest usable graph size runs as
parts of that size, one after another; a size is usable once captured, or when its capture fits in
the free device memory with ``CAPTURE_RESERVE_BYTES`` to spare."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trispec.engine.gpu.cuda_graphs import StepGraphs, padded_size
from trispec.runners.graph_plan import GraphPlan
from trispec.sampling.graph_sampler import SamplerMode

# device memory kept free beside a new capture (the eager path's prompt chunks, the allocator's slack)
CAPTURE_RESERVE_BYTES = 1 << 30


def bytes_per_logit(mode: SamplerMode) -> int:
    """Device bytes a verify graph holds per logit (estimate): the bf16 logits, then float32 copies
    for the scaled logits, the whole row's softmax (top-p) and the log-probabilities."""
    return 2 + 4 * mode.noise + 8 * mode.kept + 8 * mode.log_probs


def part_size(verify: StepGraphs, n: int, mode: SamplerMode, vocab_size: int) -> int:
    """The largest graph size already captured for this verify mode, or whose capture fits (its
    logits and sampler buffers: the bulk of a graph's memory)."""
    sizes = verify.sizes
    want = padded_size(min(n, sizes[-1]), sizes)
    if not verify.capture or (want, mode) in verify._graphs:
        return sizes[-1]  # no driver call on the steady path
    free, _ = torch.cuda.mem_get_info(verify.buffers.tokens.device)
    per_row = vocab_size * bytes_per_logit(mode)
    for size in reversed(sizes):
        captured = (size, mode) in verify._graphs
        if captured or size * verify.rows * per_row + CAPTURE_RESERVE_BYTES <= free:
            return size
    return sizes[0]


def part(plan: GraphPlan, start: int, end: int) -> GraphPlan:
    """The plan of sequences ``[start, end)`` (the catch-up is done once, before the parts)."""
    return GraphPlan(
        ks=plan.ks[start:end],
        proposals=plan.proposals[start:end],
        model=plan.model[start:end],
        replays=plan.replays if any(plan.model[start:end]) else 0,
        verify_mode=plan.verify_mode,
        draft_mode=plan.draft_mode,
    )


def ranges(n: int, size: int) -> Sequence[tuple[int, int]]:
    return [(i, min(i + size, n)) for i in range(0, n, size)]
