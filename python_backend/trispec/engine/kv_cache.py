"""Paged KV cache: one pool of fixed-size blocks per engine, handed out to sequences on demand.

The pool is two tensors (keys and values) of shape ``[num_layers, kv_heads, num_blocks * block_size,
head_dim]``: a token's "slot" is ``block * block_size + offset``. A sequence owns a block table (its
blocks in order); the ``BlockManager`` does the bookkeeping and never touches tensor data, so it is
cheap and easy to unit-test.

Allocation on demand: a sequence takes blocks only as its tokens arrive (prompt chunks, the step's
fed tokens and drafts), never for its whole ``max_length`` up front, so the pool serves as many
sequences as actually fit. The scheduler asks ``room_for`` before each step and, when the pool would
run out, preempts sequences (frees them and recomputes them later), so ``append`` running dry is a
bug, reported as ``CapacityError``. Speculative rollback is ``truncate``: the length moves back,
whole blocks past the new length return to the pool, and stale entries inside the kept last block
are simply overwritten by the next append. Full blocks of verified tokens are kept for reuse by
later requests with the same prefix (the prefix cache: ``block_manager.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trispec.engine.block_manager import BlockManager, blocks_for
from trispec.errors import ConfigError

__all__ = ["BlockManager", "KVCache", "blocks_for", "slots_of"]


def slots_of(block_table: Sequence[int], block_size: int, positions: range) -> list[int]:
    """Cache slots of a sequence's tokens at ``positions``, through its block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


class KVCache:
    """The key/value tensors of the pool. ``slot = block * block_size + offset``."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        # [layer, kv_head, slot, dim]: a sequence's keys per head are contiguous when its blocks
        # are, which SDPA likes. Zero-filled so masked-out (padding) slots never hold NaN/inf.
        shape = (num_layers, num_kv_heads, num_blocks * block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # Per-layer views, made once (indexing self.k[i] in the hot loop costs a dispatch per layer).
        self.k_layers = list(self.k.unbind(0))
        self.v_layers = list(self.v.unbind(0))
        self.block_size = block_size
        self.num_blocks = num_blocks

    @staticmethod
    def bytes_per_block(
        *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    @classmethod
    def num_blocks_for_budget(
        cls,
        kv_cache_mb: float,
        *,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> int:
        per_block = cls.bytes_per_block(
            num_layers=num_layers,
            block_size=block_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )
        n = int(kv_cache_mb * 1024 * 1024) // per_block
        if n < 1:
            raise ConfigError(
                "kv_cache_mb", f"{kv_cache_mb} MiB holds no block of {per_block / 2**20:.3f} MiB"
            )
        return n
