"""Linear layers on a GGUF file's own quantised blocks (``weights: gguf``), ``csrc/gguf_linear.c``.

Two paths:

* integer (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K on a CPU with AVX2): each row of activations is
  quantised to int8 blocks of 256 and multiplied with the file's codes by integer dot products
  (llama.cpp's way); the block scales apply once per block. Not the float32 model's numbers (the
  activations are rounded to 8 bits; docs/determinism.md), but every output is computed in one fixed
  order by one thread, so rows are the same bits whatever else shares the call, and every ISA copy
  gives the same bits. A layer can take its RMSNorm (``norm``) and its residual add (``residual``)
  into the same call: a Python op less each on a decode step's path, where they cost more than the
  arithmetic.
* float (any other type the kernel decodes, or no AVX2): the blocks decoded to exactly the float32
  values the dense path loads, multiplied in float32.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from typing import Any

import numpy as np
import torch

from trispec.cpu_isa import isa_level, q8_level
from trispec.engine.cpu.quant_blocks import QuantBlocks
from trispec.errors import ConfigError

try:
    from trispec.engine.cpu import _gguf_linear as _gguf_kernel
except ImportError:  # built by `pip install`; absent if no C compiler was found then
    _gguf_kernel = None

_GGUF_ISA = isa_level(_gguf_kernel)
_Q8_ISA = q8_level(_gguf_kernel)
# the integer path's ISA copies, by the level the kernel takes and reports (``q8_level``)
Q8_COPIES: dict[int, str] = {512: "avx512-vnni", 256: "avx-vnni", 2: "avx2"}
# ggml type -> (values, bytes) per block, for the types the GGUF kernel decodes
GGUF_FORMATS: dict[int, tuple[int, int]] = _gguf_kernel.formats() if _gguf_kernel is not None else {}
# the integer path's types (ggml ids) and the widths they need (K-quants whole 256-blocks, others 64)
Q8_TYPES: dict[int, int] = {2: 64, 6: 64, 8: 64, 12: 256, 13: 256, 14: 256}
# the integer path's types run repacked 16 columns at a time (csrc/gguf_q8_x16.h), Q5_K excepted:
# ggml id -> the plan's type
REPACKED = {2: 1002, 6: 1006, 8: 1008, 12: 1012, 14: 1014}


def gguf_supported(blocks: QuantBlocks | None) -> bool:
    """Whether the GGUF kernel computes with these blocks (a type it decodes, whole blocks per row)."""
    return (
        blocks is not None
        and blocks.columns % 16 == 0
        and _whole_blocks(blocks.ggml_type, blocks.columns, blocks.data.shape[1])
    )


def _whole_blocks(ggml_type: int, columns: int, row_bytes: int) -> bool:
    """Whether the kernel decodes this type and a row of ``row_bytes`` is ``columns`` values of it."""
    if ggml_type not in GGUF_FORMATS:
        return False
    values, nbytes = GGUF_FORMATS[ggml_type]
    return columns % values == 0 and row_bytes == columns // values * nbytes


def require_gguf_kernel() -> Any:
    if _gguf_kernel is None:
        raise ConfigError(
            "weights", "gguf weights need the GGUF kernel, which was not built (no C compiler at install?)"
        )
    return _gguf_kernel


def q8_copy(wanted: int) -> int:
    """The integer-path copy the kernel runs when asked for ``wanted`` (a key of ``Q8_COPIES``, or 0:
    none): the highest this CPU has at or below it, as the kernel itself lowers a request (asked for
    AVX-VNNI on a CPU without it, it runs AVX2)."""
    return int(_gguf_kernel.q8_level(wanted)) if _gguf_kernel is not None else 0


def integer_path(parts: list[QuantBlocks], q8_isa: int | None = None) -> bool:
    """Whether these parts (one layer) run on the integer path on this CPU."""
    isa = _Q8_ISA if q8_isa is None else q8_isa
    return isa > 0 and all(p.columns % Q8_TYPES.get(p.ggml_type, 1 << 62) == 0 for p in parts)


class GGUFLinear:
    """``y = x W^T (+ b)`` with ``W`` the rows of one or more GGUF tensors, side by side (q, k and v of
    a layer fused, each keeping its own type); float32 activations and output. Consecutive parts of
    one type are joined into one tensor. ``fused`` takes an RMSNorm before and a residual add after."""

    def __init__(self, parts: list[QuantBlocks], bias: torch.Tensor | None = None) -> None:
        require_gguf_kernel()
        columns = {p.columns for p in parts}
        if len(columns) != 1 or not all(gguf_supported(p) for p in parts):
            raise ValueError("GGUFLinear: parts must share their columns and be of a type the kernel decodes")
        self.in_features = columns.pop()
        joined: list[QuantBlocks] = []
        for p in parts:
            if joined and joined[-1].ggml_type == p.ggml_type:
                last = joined.pop()
                p = QuantBlocks(p.ggml_type, torch.cat((last.data, p.data)), p.columns)
            joined.append(p)
        self.parts = [QuantBlocks(p.ggml_type, p.data.contiguous(), p.columns) for p in joined]
        self.out_features = sum(p.rows for p in self.parts)
        self.bias = None if bias is None else bias.float().contiguous()
        self.integer = integer_path(self.parts)
        # the integer-path copy its calls run (``Q8_COPIES``); 0 on the float path
        self.q8_isa = _Q8_ISA if self.integer else 0
        # what the kernel reads: the file's blocks, or their repacked form (which replaces them)
        self._weights: list[tuple[int, torch.Tensor, int, int]] = []  # (plan type, data, rows, bytes/row)
        if self.integer:
            self._weights = [_integer_weights(p) for p in self.parts]
            # the repacked parts' blocks are dropped: only their shapes stay
            self.parts = [
                p
                if p.ggml_type not in REPACKED
                else QuantBlocks(p.ggml_type, p.data.new_empty(p.rows, 0), p.columns)
                for p in self.parts
            ]
        self._plan = self._make_plan() if self.integer else b""

    def _make_plan(self) -> bytes:
        """(type, weights, rows, row bytes, bias) per part, as the kernel reads them: built once."""
        plan, first = [], 0
        for kind, data, rows, row_bytes in self._weights:
            bias = 0 if self.bias is None else self.bias.data_ptr() + 4 * first
            plan.append(struct.pack("5q", kind, data.data_ptr(), rows, row_bytes, bias))
            first += rows
        return b"".join(plan)

    def tensors(self) -> list[torch.Tensor]:
        held = [w[1] for w in self._weights] if self.integer else [p.data for p in self.parts]
        return [t for t in (*held, self.bias) if t is not None]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)

    def fused(
        self,
        x: torch.Tensor,
        norm: torch.Tensor | None = None,
        eps: float = 0.0,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``residual + rms_norm(x) * norm @ W^T + b`` (each part optional); ``residual`` is added
        into in place and returned."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"GGUFLinear computes float32 on the CPU, got {x.dtype} on {x.device}")
        x = x.contiguous()
        rows = x.shape[0]
        if not self.integer:
            if norm is not None:
                x = x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True).add_(eps)) * norm
            y = self._float(x)
            return y if residual is None else residual.add_(y)
        shape = (rows, self.out_features)
        if residual is not None and not (residual.is_contiguous() and residual.shape == shape):
            return residual.add_(self.fused(x, norm, eps))
        out = torch.empty(shape) if residual is None else residual
        _gguf_kernel.qlinear(
            x.data_ptr(),
            rows,
            self.in_features,
            self._plan,
            out.data_ptr(),
            out.stride(0),
            torch.get_num_threads(),
            _Q8_ISA,
            0 if norm is None else norm.data_ptr(),
            eps,
            int(residual is not None),
        )
        return out

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        out = torch.empty(rows, self.out_features)
        threads, first = torch.get_num_threads(), 0
        for p in self.parts:
            bias = 0 if self.bias is None else self.bias.data_ptr() + 4 * first
            _gguf_kernel.linear(
                x.data_ptr(),
                p.data.data_ptr(),
                p.ggml_type,
                bias,
                out.data_ptr() + 4 * first,
                rows,
                self.in_features,
                p.rows,
                p.data.shape[1],
                self.out_features,
                threads,
                _GGUF_ISA,
            )
            first += p.rows
        return out


def _integer_weights(part: QuantBlocks) -> tuple[int, torch.Tensor, int, int]:
    """A part as the integer path reads it: repacked into 16-column groups (the file's blocks are then
    dropped), Q5_K as it is."""
    kind = REPACKED.get(part.ggml_type)
    if kind is None:
        return part.ggml_type, part.data, part.rows, part.data.shape[1]
    packed = weights_buffer(_gguf_kernel.packed_bytes(kind, part.rows, part.columns))
    _gguf_kernel.repack(kind, part.data.data_ptr(), part.rows, part.columns, packed.data_ptr())
    groups = (part.rows + 15) // 16
    return kind, packed, part.rows, packed.numel() // groups


HUGE_PAGE = 2 << 20


def weights_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh memory for weights a decode step streams, on transparent huge pages where
    the system gives them on request (THP ``madvise`` mode): with 4 KiB pages every 4 KiB of a
    stream costs a TLB miss and stops the hardware prefetcher (which does not cross pages), which
    showed in the pace a step reads its weights. Whole 2 MiB pages only: the tail stays small pages."""
    if nbytes < 2 * HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    # private anonymous memory (a shared mapping would be shmem, under other THP rules), untouched
    # until the repacking writes it; the tensor keeps the mapping alive
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    with contextlib.suppress(OSError):  # no THP here: small pages, the same numbers
        region.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return whole[start : start + nbytes]


def gguf_rows(blocks: QuantBlocks, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of a GGUF tensor as float32 (an embedding lookup): the values gguf-py gives."""
    kernel = require_gguf_kernel()
    if ids.dtype != torch.int64 or not ids.is_contiguous():
        ids = ids.to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), blocks.columns)
    kernel.dequantize(
        blocks.data.data_ptr(),
        blocks.ggml_type,
        ids.data_ptr(),
        ids.numel(),
        blocks.columns,
        out.data_ptr(),
        blocks.data.shape[1],
        _GGUF_ISA,
    )
    return out


def decode_rows(rows: np.ndarray, ggml_type: int, columns: int) -> np.ndarray | None:
    """Every row of a GGUF tensor's blocks (uint8 ``[rows, row bytes]``, C order) as float32
    ``[rows, columns]``: the values gguf-py's dequantize gives, decoded in C (gguf-py's numpy made
    most of a model load). None where the kernel cannot: not built, or a type it does not decode."""
    if _gguf_kernel is None or rows.ndim != 2 or not rows.flags.c_contiguous:
        return None
    if not _whole_blocks(ggml_type, columns, rows.shape[1]):
        return None
    out = np.empty((rows.shape[0], columns), dtype=np.float32)
    if rows.shape[0]:
        _gguf_kernel.dequantize(
            rows.ctypes.data, ggml_type, 0, rows.shape[0], columns, out.ctypes.data, rows.shape[1], _GGUF_ISA
        )
    return out
