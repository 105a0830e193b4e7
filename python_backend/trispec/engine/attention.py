"""Attention over the paged KV cache for a packed ragged batch: two interchangeable backends.

* ``PagedAttention`` (CPU, the default; ``cpu/paged_attention.py``): the C kernel in
  ``cpu/csrc/paged_attention.c``. Every query row
  attends to exactly its own keys, read through its block table by one thread in a fixed order, so
  a row's output does not depend on the other rows of the batch, on how many drafts share its
  sequence's pass, on padding or on the thread count. That batch invariance is what makes a seeded
  request reproduce whatever it is batched with, and greedy speculation equal target-only decoding
  bit for bit. Measured on the 2-core AVX-512 machine it is also faster than the SDPA path in decode
  and verify (no gather of the keys into a padded copy) and on par in prefill.
* ``GroupedSDPA`` (any device; the CPU fallback when the extension did not build): sequences with
  the same number of new tokens share one ``scaled_dot_product_attention`` call, keys gathered and
  padded to the group's longest context. Not batch-invariant: torch's CPU kernel changes its GEMM
  blocking with the batch, the query count and the padding (fp32 results move in the last bits).

Both take the batch layout from ``Transformer.make_batch``: sequences packed in groups of equal new
token count, each sequence's rows contiguous.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from trispec.engine.cpu.paged_attention import PagedAttention, kernel_built

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeqRows:
    """One sequence of a forward, as attention sees it: rows ``[t0, t0 + n)`` of the packed batch
    are its new tokens, at positions ``start .. start + n - 1``."""

    t0: int
    n: int
    start: int
    block_table: Sequence[int]


class Attention(Protocol):
    """``plan`` runs once per forward (shared by every layer); ``__call__`` once per layer, after the
    layer's new keys/values were written to the cache. Returns ``[T, H * D]``."""

    def plan(self, seqs: Sequence[SeqRows], block_size: int, dtype: torch.dtype) -> object: ...

    def __call__(
        self,
        plan: object,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor: ...


# ---------------------------------------------------------------------------------------------------
# torch SDPA over groups of sequences with equal new-token counts.


@dataclass
class AttnGroup:
    """Sequences with the same number ``n`` of new tokens, contiguous in the packed batch."""

    t0: int  # first packed row of the group
    batch: int  # sequences in the group
    n: int  # new tokens per sequence
    ctx: int  # longest context (cached + new) in the group; keys are padded to it
    kv_slots: torch.Tensor | None  # [batch * ctx] cache slots to gather; None: see below
    kv_range: tuple[int, int] | None  # one sequence in consecutive blocks: slots [a, b), no gather
    mask: torch.Tensor | None  # [batch, 1, n, ctx] additive (0 / -inf)
    causal: bool  # plain causal mask (fresh prefill, queries == keys)


class GroupedSDPA:
    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        device: torch.device | None = None,
    ) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.device = device or torch.device("cpu")

    def plan(self, seqs: Sequence[SeqRows], block_size: int, dtype: torch.dtype) -> list[AttnGroup]:
        groups: list[AttnGroup] = []
        ordered = sorted((s for s in seqs if s.n), key=lambda s: s.t0)
        i = 0
        while i < len(ordered):
            j = i
            while j < len(ordered) and ordered[j].n == ordered[i].n:
                j += 1
            groups.append(self._group(ordered[i:j], block_size, dtype))
            i = j
        if self.device.type != "cpu":  # built on the host, used on the device
            groups = [
                dataclasses.replace(
                    g,
                    kv_slots=None if g.kv_slots is None else g.kv_slots.to(self.device, non_blocking=True),
                    mask=None if g.mask is None else g.mask.to(self.device, non_blocking=True),
                )
                for g in groups
            ]
        return groups

    @staticmethod
    def _group(members: Sequence[SeqRows], block_size: int, dtype: torch.dtype) -> AttnGroup:
        b, n = len(members), members[0].n
        ctx = max(s.start for s in members) + n
        if all(s.start == 0 for s in members):
            # a fresh prefill: the keys are exactly the new tokens, attend to them directly
            return AttnGroup(members[0].t0, b, n, ctx, None, None, None, n > 1)
        nblk = -(-ctx // block_size)
        kv_slots: torch.Tensor | None = None
        kv_range: tuple[int, int] | None = None
        bt = members[0].block_table
        if b == 1 and list(bt[:nblk]) == list(range(bt[0], bt[0] + nblk)):
            # consecutive blocks (common: the free list hands them out in order): a slice view
            kv_range = (bt[0] * block_size, bt[0] * block_size + ctx)
        else:
            # padded block tables; padding points at block 0 (masked out, never written)
            table = torch.zeros(b, nblk, dtype=torch.long)
            for r, s in enumerate(members):
                table[r, : len(s.block_table)] = torch.as_tensor(s.block_table[:nblk], dtype=torch.long)
            kv_slots = (
                (table[:, :, None] * block_size + torch.arange(block_size)).view(b, -1)[:, :ctx].flatten()
            )
        mask = None
        if not (n == 1 and all(s.start + 1 == ctx for s in members)):  # else every query sees every key
            pos = torch.tensor([s.start for s in members])[:, None] + torch.arange(n)
            allowed = (torch.arange(ctx)[None, None, :] <= pos[:, :, None]).unsqueeze(1)
            # additive float mask, built once: SDPA would convert a bool mask in every layer
            mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
        return AttnGroup(members[0].t0, b, n, ctx, kv_slots, kv_range, mask, False)

    def __call__(
        self,
        plan: object,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        assert isinstance(plan, list)
        H, KV, D = self.num_heads, self.num_kv_heads, self.head_dim
        outs = []
        for g in plan:
            rows = slice(g.t0, g.t0 + g.batch * g.n)
            qg = q[rows].view(g.batch, g.n, H, D).transpose(1, 2)
            if g.kv_range is not None:
                kg = k_cache[:, g.kv_range[0] : g.kv_range[1]].unsqueeze(0)
                vg = v_cache[:, g.kv_range[0] : g.kv_range[1]].unsqueeze(0)
            elif g.kv_slots is not None:
                kg = k_cache.index_select(1, g.kv_slots).view(KV, g.batch, g.ctx, D).transpose(0, 1)
                vg = v_cache.index_select(1, g.kv_slots).view(KV, g.batch, g.ctx, D).transpose(0, 1)
            else:
                kg = k[rows].view(g.batch, g.n, KV, D).transpose(1, 2)
                vg = v[rows].view(g.batch, g.n, KV, D).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=g.mask, is_causal=g.causal, scale=self.scale, enable_gqa=KV != H
            )
            outs.append(o.transpose(1, 2).reshape(g.batch * g.n, H * D))
        if not outs:
            return q.new_empty(0, H * D)
        return outs[0] if len(outs) == 1 else torch.cat(outs)


_warned_fallback = False


def make_attention(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
    backend: str = "auto",
) -> Attention:
    """``auto``: the batch-invariant kernel where it runs (CPU, fp32/bf16), else grouped SDPA."""
    global _warned_fallback
    scale = head_dim**-0.5
    paged_ok = PagedAttention.supports(device, dtype, num_heads, num_kv_heads, head_dim)
    if backend == "paged" and not paged_ok:
        raise RuntimeError(
            "attention backend 'paged' needs the built extension, a CPU device, float32/bfloat16 and a "
            f"head_dim divisible by {PagedAttention.LANES}"
        )
    if backend in ("auto", "paged") and paged_ok:
        return PagedAttention(num_heads, num_kv_heads, head_dim, scale)
    if backend not in ("auto", "sdpa"):
        raise ValueError(f"unknown attention backend {backend!r} (auto, paged, sdpa)")
    if backend == "auto" and device.type == "cpu" and not _warned_fallback:
        _warned_fallback = True
        logger.warning(
            "batch-invariant paged attention is unavailable (%s); using torch SDPA: outputs may differ "
            "in the last bits with what a request is batched with",
            "extension not built" if not kernel_built() else "unsupported dtype or head_dim",
        )
    return GroupedSDPA(num_heads, num_kv_heads, head_dim, scale, device)
