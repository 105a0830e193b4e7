"""Every decoder layer of a GGUF model in one call of the GGUF kernel (``csrc/gguf_stack.h``).

Where every linear layer runs on the integer path and attention is the paged kernel, a forward's
layers are one C call: RMSNorm, q|k|v, RoPE, the cache writes, attention, o and the residual, RMSNorm,
gate|up, SiLU * up, down and the residual, for all layers, by one team of threads. Layer by layer from
Python the same step paid ~8 ops and a thread team per linear call, 4-6 ms a token on a 1.5B model.

Batch-invariant like the kernels it is made of; RoPE and SiLU are computed by the stack's own code
(explicit fused multiply-adds, the paged kernel's exp), so their last bits are not torch's: an engine
runs every forward (prefill, verify, decode) through the stack or none, never a mix, so a position's
keys and values are the same bits whichever step computed them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from trispec.engine.cpu.gguf_linear import _Q8_ISA, GGUFLinear, _gguf_kernel
from trispec.engine.cpu.paged_attention import PagedAttention, PagedPlan, kernel_built


class LayerWeights(Protocol):
    """A decoder layer's weights as the stack reads them (``model.LayerWeights`` is one)."""

    @property
    def qkv(self) -> object: ...
    @property
    def o(self) -> object: ...
    @property
    def gate_up(self) -> object: ...
    @property
    def down(self) -> object: ...
    @property
    def attn_norm(self) -> torch.Tensor | None: ...
    @property
    def mlp_norm(self) -> torch.Tensor | None: ...


@dataclass(frozen=True)
class StackRows:
    """What one forward's rows need beside their hidden states: the model's RoPE tables, cos / signed
    sin ``[positions, D]`` (a row's position is read from the plan: its ``row_len - 1``), each row's
    cache slot (int64) and the attention plan."""

    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    plan: PagedPlan


MAX_HEAD_DIM = 512  # csrc/gguf_stack_isa.h
KEEP_BYTES = 8 << 20  # the largest workspace kept between calls


class GGUFLayerStack:
    """The layers' plan, built once; ``run`` updates a forward's hidden states in place."""

    def __init__(
        self,
        layers: Sequence[LayerWeights],
        attention: PagedAttention,
        *,
        hidden_size: int,
        intermediate_size: int,
        eps: float,
    ) -> None:
        self.attention = attention
        self.isa = _Q8_ISA  # which Q8 copy runs (a test compares them)
        head = struct.pack(
            "6q2d",
            len(layers),
            hidden_size,
            attention.num_heads,
            attention.num_kv_heads,
            attention.head_dim,
            intermediate_size,
            eps,
            attention.scale,
        )
        records = [head]
        # the norms and weights the plan points at stay alive with the layers the model holds
        for layer in layers:
            linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
            plans = [m._plan for m in linears]  # type: ignore[attr-defined]
            assert layer.attn_norm is not None and layer.mlp_norm is not None
            counts = [len(p) // 40 for p in plans]
            records.append(struct.pack("6q", layer.attn_norm.data_ptr(), layer.mlp_norm.data_ptr(), *counts))
            records.extend(plans)
        self.plan = b"".join(records)
        # every buffer of a call (activations, int8 blocks, attention's work), grown as needed and
        # kept up to KEEP_BYTES (a decode or verify step's): such a step allocates nothing, and a long
        # prompt's tens of MB are not held for the engine's life
        self.workspace = torch.empty(0, dtype=torch.uint8)

    @staticmethod
    def applies(layers: Sequence[LayerWeights], attention: object, dtype: torch.dtype) -> bool:
        """Whether these layers run as a stack: every linear layer on the integer path, both norms
        kept as weights (float32, contiguous), float32 paged attention, heads the stack rotates."""
        if _gguf_kernel is None or not hasattr(_gguf_kernel, "layers") or not kernel_built() or _Q8_ISA == 0:
            return False
        if dtype != torch.float32 or not isinstance(attention, PagedAttention) or not layers:
            return False
        if attention.head_dim > MAX_HEAD_DIM or attention.head_dim % 16:
            return False
        for layer in layers:
            linears = (layer.qkv, layer.o, layer.gate_up, layer.down)
            if not all(isinstance(m, GGUFLinear) and m.integer for m in linears):
                return False
            norms = (layer.attn_norm, layer.mlp_norm)
            if not all(n is not None and n.dtype == torch.float32 and n.is_contiguous() for n in norms):
                return False
        return True

    def run(
        self, x: torch.Tensor, rows: StackRows, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        """Every layer over the packed rows ``x`` ``[T, hidden]`` (in place); their keys and values
        are written to the caches ``[layers, KV, slots, D]`` at ``rows.slots``. Returns ``x``."""
        if not (x.is_contiguous() and x.dtype == torch.float32):
            raise ValueError("the layer stack runs on contiguous float32 rows")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype == torch.float32):
            raise ValueError("the layer stack writes contiguous float32 caches")
        cos, sin = rows.cos, rows.sin
        if not (cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape):
            raise ValueError("the layer stack reads contiguous RoPE tables of one shape")
        while True:
            needed = self._call(x, rows, cos, sin, k_cache, v_cache)
            if needed == 0:
                break
            self.workspace = torch.empty(needed + 64 + needed // 4, dtype=torch.uint8)  # room to grow
        if self.workspace.numel() > KEEP_BYTES:
            self.workspace = torch.empty(0, dtype=torch.uint8)
        return x

    def _call(
        self,
        x: torch.Tensor,
        rows: StackRows,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> int:
        ws, plan = self.workspace, rows.plan
        start = -ws.data_ptr() % 64  # the kernel's buffers start on cache lines
        return _gguf_kernel.layers(  # type: ignore[union-attr]
            self.plan,
            x.data_ptr(),
            x.shape[0],
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            k_cache.shape[2],
            cos.data_ptr(),
            sin.data_ptr(),
            cos.shape[0],
            rows.slots.data_ptr(),
            plan.tables.data_ptr(),
            plan.row_table.data_ptr(),
            plan.row_len.data_ptr(),
            plan.block_size,
            torch.get_num_threads(),
            self.isa,
            self.attention.isa,
            ws.data_ptr() + start,
            max(ws.numel() - start, 0),
        )
