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
whole blocks past the new length return to the free list, and stale entries inside the kept last
block are simply overwritten by the next append.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from trispec.errors import CapacityError, ConfigError


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of blocks needed to hold ``num_tokens`` tokens."""
    return -(-num_tokens // block_size)


def slots_of(block_table: Sequence[int], block_size: int, positions: range) -> list[int]:
    """Cache slots of a sequence's tokens at ``positions``, through its block table."""
    return [block_table[p // block_size] * block_size + p % block_size for p in positions]


@dataclass
class _SeqBlocks:
    max_length: int  # the most tokens this sequence may ever hold (a cap, not a reservation)
    length: int = 0
    table: list[int] = field(default_factory=list)


class BlockManager:
    """Free list + per-sequence block tables. Pure bookkeeping, no tensors."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ConfigError("num_blocks", f"must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ConfigError("block_size", f"must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack: the most recently freed block is reused first (it is likely still in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._seqs: dict[int, _SeqBlocks] = {}

    # -- queries -------------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def length(self, seq_id: int) -> int:
        return self._get(seq_id).length

    def max_length(self, seq_id: int) -> int:
        return self._get(seq_id).max_length

    def block_table(self, seq_id: int) -> list[int]:
        return self._get(seq_id).table

    def blocks_to_grow(self, seq_id: int, length: int) -> int:
        """Blocks a sequence must still take to hold ``length`` tokens (all of them for one not
        registered yet)."""
        seq = self._seqs.get(seq_id)
        return max(blocks_for(length, self.block_size) - (len(seq.table) if seq else 0), 0)

    def room_for(self, lengths: Mapping[int, int]) -> bool:
        """Whether every sequence can grow to its length at once (within its own cap)."""
        for seq_id, length in lengths.items():
            seq = self._seqs.get(seq_id)
            if seq is not None and length > seq.max_length:
                return False
        return sum(self.blocks_to_grow(s, n) for s, n in lengths.items()) <= len(self._free)

    # -- mutations -----------------------------------------------------------------------------
    def add(self, seq_id: int, max_length: int) -> None:
        """Register a sequence; it takes no block until tokens arrive."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id {seq_id} is already registered")
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        self._seqs[seq_id] = _SeqBlocks(max_length=max_length)

    def append(self, seq_id: int, num_tokens: int) -> None:
        """Grow the sequence by ``num_tokens``, taking blocks from the free list as needed."""
        seq = self._get(seq_id)
        new_length = seq.length + num_tokens
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if new_length > seq.max_length:
            raise ValueError(f"seq {seq_id}: {new_length} tokens exceed its cap of {seq.max_length}")
        need = blocks_for(new_length, self.block_size) - len(seq.table)
        if need > len(self._free):
            raise CapacityError(
                f"sequence {seq_id} needs {need} more KV blocks for {new_length} tokens, "
                f"{len(self._free)} of {self.num_blocks} are free"
            )
        for _ in range(need):
            seq.table.append(self._free.pop())
        seq.length = new_length

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep the first ``length`` tokens; whole blocks past them go back to the free list."""
        seq = self._get(seq_id)
        if not 0 <= length <= seq.length:
            raise ValueError(f"seq {seq_id}: cannot truncate to {length} (length is {seq.length})")
        keep = blocks_for(length, self.block_size)
        released = seq.table[keep:]
        del seq.table[keep:]
        self._free.extend(reversed(released))
        seq.length = length

    def free(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            raise ValueError(f"unknown seq_id {seq_id}")
        self._free.extend(reversed(seq.table))

    def _get(self, seq_id: int) -> _SeqBlocks:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"unknown seq_id {seq_id}")
        return seq


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
