"""The batch-invariant paged attention kernel (``csrc/paged_attention.c``) behind the engine's
``Attention`` interface (``trispec.engine.attention``): every query row attends to exactly its own
keys, read through its block table by one thread in a fixed order, so a row's output does not depend
on the other rows of the batch, on padding or on the thread count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from trispec.cpu_isa import isa_level
from trispec.engine.cpu.host_ints import host_ints

try:
    from trispec.engine.cpu import _paged_attention as _kernel
except ImportError:  # built by `pip install`; absent if no C compiler was found then
    _kernel = None


def kernel_built() -> bool:
    return _kernel is not None


class RowSpan(Protocol):
    """One sequence's rows of a packed batch (``trispec.engine.attention.SeqRows`` is one)."""

    @property
    def t0(self) -> int: ...
    @property
    def n(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def block_table(self) -> Sequence[int]: ...


@dataclass
class PagedPlan:
    tables: torch.Tensor  # int32: every sequence's block table, concatenated
    row_table: torch.Tensor  # int64 [T]: where each row's block table starts in ``tables``
    row_len: torch.Tensor  # int32 [T]: keys each row attends to (its position + 1)
    block_size: int


class PagedAttention:
    LANES = 16  # the kernel's vector width; head_dim must be a multiple of it

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        if _kernel is None:
            raise RuntimeError("the paged attention extension is not built")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = (
            num_heads,
            num_kv_heads,
            head_dim,
            scale,
        )
        self.isa = isa_level(_kernel)

    @classmethod
    def supports(
        cls, device: torch.device, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int
    ) -> bool:
        return (
            _kernel is not None
            and device.type == "cpu"
            and dtype in (torch.float32, torch.bfloat16)
            and head_dim % cls.LANES == 0
            and num_heads // num_kv_heads <= 64
        )

    def plan(self, seqs: Sequence[RowSpan], block_size: int, dtype: torch.dtype) -> PagedPlan:
        tables: list[int] = []
        row_table: list[int] = []
        row_len: list[int] = []
        for s in sorted(seqs, key=lambda s: s.t0):
            offset = len(tables)
            tables.extend(s.block_table)
            row_table.extend([offset] * s.n)
            row_len.extend(range(s.start + 1, s.start + s.n + 1))
        return PagedPlan(
            tables=host_ints(tables or [0], torch.int32),
            row_table=host_ints(row_table),
            row_len=host_ints(row_len, torch.int32),
            block_size=block_size,
        )

    def __call__(
        self,
        plan: object,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        assert isinstance(plan, PagedPlan) and _kernel is not None
        H, KV, D = self.num_heads, self.num_kv_heads, self.head_dim
        T = q.shape[0]
        if q.stride(2) != 1 or q.stride(1) != D:
            q = q.contiguous()
        out = torch.empty(T, H * D, dtype=q.dtype)
        if T:
            _kernel.attend(
                q.data_ptr(),
                k_cache.data_ptr(),
                v_cache.data_ptr(),
                out.data_ptr(),
                plan.tables.data_ptr(),
                plan.row_table.data_ptr(),
                plan.row_len.data_ptr(),
                q.stride(0),
                k_cache.shape[1],
                T,
                H,
                KV,
                D,
                plan.block_size,
                q.dtype == torch.bfloat16,
                self.scale,
                torch.get_num_threads(),
                self.isa,
            )
        return out
