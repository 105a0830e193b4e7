"""Linear layers as plain callables: dense (oneDNN prepacked), int8 weight-only, and GGUF blocks.

Both are batch-invariant: a row's output does not depend on how many rows are computed with it
(see ``DenseLinear`` for the one exception and how it is avoided), which the engine's determinism
rests on.

int8 weight-only: our C kernel (``csrc/int8_linear.c``) reads 4x fewer weight bytes than fp32, which
is what a draft model's single-token step on CPU is bound by, and computes every output in one fixed
order (batch-invariant, and the same numbers on AVX2 and AVX-512). Without the extension (no C
compiler at install) torch's ``_weight_int8pack_mm`` stands in: fast only with bfloat16
activations, which is why int8 engines run in bfloat16 by default, and not batch-invariant.

GGUF blocks (``weights: gguf``): ``gguf_linear.py`` (re-exported here).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from trispec.cpu_isa import isa_level

try:
    from trispec.engine.cpu import _int8_linear as _int8_kernel
except ImportError:  # built by `pip install`; absent if no C compiler was found then
    _int8_kernel = None

_INT8_ISA = isa_level(_int8_kernel)
logger = logging.getLogger(__name__)


class Linear(Protocol):
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def tensors(self) -> list[torch.Tensor]:
        """The tensors held (weights, scales, bias), for memory accounting."""
        ...


def _present(*tensors: torch.Tensor | None) -> list[torch.Tensor]:
    return [t for t in tensors if t is not None]


def _has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_NATIVE_BF16 = _has_native_bf16()


def _find_onednn_linear() -> Any:
    """oneDNN's prepacked linear (what inductor uses on CPU), if it works in this build.

    Returns the resolved op overload: calling ``torch.ops.mkldnn._linear_pointwise`` by attribute
    costs ~10 us per call in overload resolution, 1 ms per step over 121 matmuls.
    """
    try:
        op = torch.ops.mkldnn._linear_pointwise.default
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 8), 5)
        ok = torch.equal(op(torch.ones(2, 8), w, None, "none", [], ""), torch.full((2, 4), 8.0))
    except (AttributeError, RuntimeError):
        return None
    return op if ok else None


_onednn_linear = _find_onednn_linear()


def _has_amx() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


# oneDNN switches a bf16 GEMM to AMX tiles from 33 rows on (measured, CPUs with AMX): about a fifth
# of the rows of a call then differ in the last bits from the same rows computed alone, so with AMX
# a bf16 layer computes at most 32 rows per call (every count up to 32 agrees, shapes of SmolLM2 and
# Qwen2.5 up to K = 8960 and a 49152-row head). Off where there is no AMX: a loss of AMX's speed on
# a prompt, where bf16 layers are not the default (the target runs fp32, drafts int8).
_BF16_MAX_ROWS = 32 if _has_amx() else None


class DenseLinear:
    """``y = x W^T + b`` through oneDNN's prepacked kernel.

    Why prepacked oneDNN: (1) speed — on the 2-core AVX2 CPU (SmolLM2-135M, 2 threads) a 5-token
    verify step costs ~1.9x a 1-token decode with MKL (F.linear), ~1.2-1.3x with oneDNN's brgemm;
    (2) batch invariance — measured on AVX2 and AVX-512, each output row of the prepacked kernel is
    bit-identical whatever the number of rows (MKL's sgemm is not: 1 row takes a GEMV path).
    bfloat16 weights are packed as bfloat16 where oneDNN runs it natively (AVX-512 BF16 / AMX /
    AVX-NE-CONVERT); elsewhere they are widened to float32 once at load and packed (the values are
    still the bf16-rounded weights; the memory is float32's): torch's own bf16 GEMM there costs ~M
    times a 1-row GEMV and switching kernels by row count would break the invariance.
    ``prepack=False`` (or a build without oneDNN) keeps a plain tensor and ``F.linear``.
    """

    # Batch-size hint for the packed layout: the verify step (a few tokens) is the one to win.
    PACK_HINT = 5

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.out_dtype = weight.dtype
        self.weight: torch.Tensor | None = weight.contiguous()
        self.packed: torch.Tensor | None = None
        self.bias = bias
        if prepack and _onednn_linear is not None and weight.device.type == "cpu":
            if weight.dtype == torch.bfloat16 and not _NATIVE_BF16:
                weight, bias = weight.float(), None if bias is None else bias.float()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), self.PACK_HINT)
            self.bias = bias
            self.weight = None  # the packed copy replaces it
            self.pad_one_row = not self._one_row_agrees()

    # Whether a single row must be computed as two. oneDNN's one-row path can split a long
    # reduction across threads (on AVX-512, K >= 1536 in SmolLM2 / Qwen2.5 shapes), and the row then
    # differs in the last bits from the same row among others; every row count >= 2 agrees (measured
    # up to 600 rows, AVX2 and AVX-512). For float32 this is checked once per layer on a fixed probe:
    # a different summation order shows in nearly every output (85-95 % of them measured), and
    # padding only where needed saves ~1 ms per 1-token step. bfloat16 outputs hide most of the
    # difference in their rounding (1 output in ~7000 differs), so no probe can clear a bf16 layer:
    # those always pad.
    pad_one_row = False

    def _one_row_agrees(self) -> bool:
        assert self.packed is not None
        if self.packed.dtype != torch.float32:
            return False
        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(2, self.in_features, generator=generator)
        two = _onednn_linear(probe, self.packed, self.bias, "none", [], "")
        one = _onednn_linear(probe[:1].contiguous(), self.packed, self.bias, "none", [], "")
        return torch.equal(one[0], two[0])

    def tensors(self) -> list[torch.Tensor]:
        return _present(self.weight, self.packed, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)  # type: ignore[arg-type]
        if x.shape[0] == 1 and self.pad_one_row:
            return self(torch.cat((x, x)))[:1]
        if _BF16_MAX_ROWS is not None and self.packed.dtype == torch.bfloat16 and x.shape[0] > _BF16_MAX_ROWS:
            return torch.cat([self(part) for part in x.split(_BF16_MAX_ROWS)])
        if self.packed.dtype != x.dtype:  # bf16 widened to fp32 (no native bf16)
            return _onednn_linear(x.to(self.packed.dtype), self.packed, self.bias, "none", [], "").to(x.dtype)
        return _onednn_linear(x, self.packed, self.bias, "none", [], "")


# int8 weight-only, per-output-channel scales (the self-draft's lower precision)


def quantize_per_channel(
    weight: torch.Tensor, rows_per_chunk: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: ``weight ~= q * scale[:, None]``. In row chunks: the float
    temporaries of a whole 151936 x 896 embedding would briefly need 2 GB more."""
    q = torch.empty(weight.shape, dtype=torch.int8)
    scale = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], rows_per_chunk):
        w = weight[start : start + rows_per_chunk].to(torch.float32)
        s = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q[start : start + rows_per_chunk] = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
        scale[start : start + rows_per_chunk] = s
    return q.contiguous(), scale


class Int8Linear:
    """``y = (x W_q^T) * scale (+ b)``: int8 weights, one scale per output channel, float32 or
    bfloat16 activations (the output has the activations' dtype)."""

    _warned = False  # the missing-extension warning, once per process

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight.contiguous()  # [out, in] int8
        self.scales = scales  # [out], activation dtype (the int8 embedding's lookup uses them too)
        self.bias = bias
        self.out_features = weight.shape[0]
        # what the kernel reads: scales and bias in float32
        self._scales_f32 = scales.float().contiguous()
        self._bias_f32 = None if bias is None else bias.float().contiguous()

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None, *, dtype: torch.dtype) -> Int8Linear:
        if _int8_kernel is None and not Int8Linear._warned:
            Int8Linear._warned = True
            logger.warning(
                "the int8 linear extension is not built (no C compiler at install?): int8 layers use "
                "torch's _weight_int8pack_mm, which is slower and not batch-invariant"
            )
        q, scale = quantize_per_channel(weight)
        return cls(q, scale.to(dtype), None if bias is None else bias.to(dtype))

    def tensors(self) -> list[torch.Tensor]:
        return _present(self.weight, self.scales, self.bias, self._scales_f32, self._bias_f32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _int8_kernel is None or x.dtype not in (torch.float32, torch.bfloat16) or x.device.type != "cpu":
            y = torch._weight_int8pack_mm(x.contiguous(), self.weight, self.scales)
            return y if self.bias is None else y + self.bias
        x = x.contiguous()
        rows, features = x.shape
        out = torch.empty(rows, self.out_features, dtype=x.dtype)
        is_bf16 = int(x.dtype == torch.bfloat16)
        _int8_kernel.linear(
            x.data_ptr(),
            self.weight.data_ptr(),
            self._scales_f32.data_ptr(),
            0 if self._bias_f32 is None else self._bias_f32.data_ptr(),
            out.data_ptr(),
            rows,
            features,
            self.out_features,
            is_bf16,
            is_bf16,
            torch.get_num_threads(),
            _INT8_ISA,
        )
        return out


class RowSplitLinear:
    """A linear layer kept as blocks of output rows, each its own ``DenseLinear``; the output is the
    blocks' outputs side by side. For the LM head of a large vocabulary: building it then never holds
    the whole float matrix and its packed copy at once (151936 x 1536 in fp32 is 0.93 GB each)."""

    def __init__(self, parts: list[DenseLinear]) -> None:
        self.parts = parts
        self.out_features = sum(p.out_features for p in parts)

    def tensors(self) -> list[torch.Tensor]:
        return [t for p in self.parts for t in p.tensors()]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


# GGUF blocks: their own module; imported here too, where they always lived
from trispec.engine.cpu.gguf_linear import (  # noqa: E402
    GGUF_FORMATS,
    GGUFLinear,
    _gguf_kernel,
    gguf_rows,
    gguf_supported,
    require_gguf_kernel,
)

__all__ = [
    "GGUF_FORMATS",
    "DenseLinear",
    "GGUFLinear",
    "Int8Linear",
    "Linear",
    "RowSplitLinear",
    "_gguf_kernel",
    "gguf_rows",
    "gguf_supported",
    "quantize_per_channel",
    "require_gguf_kernel",
]
