"""The GGUF kernel's integer path (``csrc/gguf_q8.h``): int8 activation blocks times the file's codes,
and Q4_K / Q6_K repacked into 16-column groups (``csrc/gguf_q8_x16.h``, what the engine runs).

Exact where it promises to be: against a float64 reference that quantises x the way the kernel says
it does (``quantised``), the error is float32 rounding only; every ISA copy (AVX-512 VNNI, AVX-VNNI,
AVX2) gives the same bits as the AVX2 copy; a row's output does not depend on the rows beside it, the
row tiles or the thread count. Against the float32 model (x not quantised) it is within the stated
tolerance. A copy this CPU lacks is a skip that says so (the kernel would run a lower copy in its
place, and the comparison would be of that copy with itself); the test ids name each copy.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from gguf_files import K_QUANTS, T, random_blocks
from isa_copies import q8_copies, require_q8_copy
from required_builds import c_kernel
from trispec.engine.cpu.gguf_linear import Q8_COPIES, GGUFLinear, integer_path, q8_copy
from trispec.engine.cpu.quant_blocks import QuantBlocks

kernel = c_kernel("trispec.engine.cpu._gguf_linear")
pytestmark = pytest.mark.skipif(kernel.q8_level(2) == 0, reason="the GGUF kernel's integer path needs AVX2")

TYPES = [T.Q4_K, T.Q5_K, T.Q6_K, T.Q4_0, T.Q5_0, T.Q8_0]
AVX2 = 2  # the reference copy: every CPU with an integer path has it
ISAS = list(Q8_COPIES)  # 512, 256, 2


def blocks(qtype: T, rows: int, columns: int, seed: int) -> np.ndarray:
    if qtype in K_QUANTS:
        return np.ascontiguousarray(random_blocks(qtype, rows, columns, seed))
    w = (np.random.default_rng(seed).standard_normal((rows, columns)) * 0.05).astype(np.float32)
    return np.ascontiguousarray(quantize(w, qtype))


def qlinear(
    x: torch.Tensor,
    parts: list[tuple[np.ndarray, T, torch.Tensor | None]],
    isa: int,
    *,
    threads: int = 2,
    norm: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    rows, columns = x.shape
    plan = b"".join(
        struct.pack(
            "5q", int(t), raw.ctypes.data, raw.shape[0], raw.shape[1], 0 if b is None else b.data_ptr()
        )
        for raw, t, b in parts
    )
    n = sum(raw.shape[0] for raw, _, _ in parts)
    target = torch.empty(rows, n) if out is None else out
    kernel.qlinear(
        x.data_ptr(), rows, columns, plan, target.data_ptr(), n, threads, isa,
        0 if norm is None else norm.data_ptr(), 1e-6, int(out is not None),
    )  # fmt: skip
    return target


def repacked(raw: np.ndarray, qtype: T, columns: int) -> tuple[np.ndarray, int, int]:
    """(packed bytes, plan type, bytes per 16-column group) of the rows ``raw``."""
    kind, rows = 1000 + int(qtype), raw.shape[0]
    packed = np.zeros(kernel.packed_bytes(kind, rows, columns), dtype=np.uint8)
    kernel.repack(kind, raw.ctypes.data, rows, columns, packed.ctypes.data)
    return packed, kind, packed.size // ((rows + 15) // 16)


def run_packed(
    x: torch.Tensor, raw: np.ndarray, qtype: T, isa: int, threads: int = 2, bias=None
) -> torch.Tensor:
    packed, kind, group_bytes = repacked(raw, qtype, x.shape[1])
    rows, n = x.shape[0], raw.shape[0]
    out = torch.empty(rows, n)
    plan = struct.pack("5q", kind, packed.ctypes.data, n, group_bytes, 0 if bias is None else bias.data_ptr())
    kernel.qlinear(x.data_ptr(), rows, x.shape[1], plan, out.data_ptr(), n, threads, isa, 0, 0.0, 0)
    return out


def quantised(x: np.ndarray) -> np.ndarray:
    """x as the kernel's int8 blocks stand for it: per 256 values d = amax / 127, q = round(x / d)."""
    out = np.zeros(x.shape)
    for g in range(0, x.shape[1], 256):
        block = x[:, g : g + 256].astype(np.float32)
        amax = np.abs(block).max(1, keepdims=True)
        inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        out[:, g : g + 256] = np.clip(np.rint(block * inverse), -127, 127) * (amax / np.float32(127))
    return out


def columns_of(qtype: T) -> int:
    return 768 if qtype in K_QUANTS else 576  # K-quants: whole 256-blocks; others: a partial last one


@pytest.mark.parametrize("isa", q8_copies())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_exact_up_to_float_rounding_for_the_quantised_activations(qtype: T, isa: int) -> None:
    require_q8_copy(isa)
    columns = columns_of(qtype)
    raw = blocks(qtype, 21, columns, 1)
    w = np.asarray(dequantize(raw, qtype), dtype=np.float64).reshape(21, columns)
    x = torch.randn(7, columns, generator=torch.Generator().manual_seed(0))
    x[0, :256] = 0.0  # a block of zeros: scale 0
    bias = torch.randn(21)
    expected = quantised(x.numpy()) @ w.T + bias.numpy()
    got = qlinear(x, [(raw, qtype, bias)], isa).double().numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    # and against the float32 model: the stated tolerance (docs/determinism.md)
    exact = x.double().numpy() @ w.T + bias.numpy()
    assert np.abs(got - exact).max() <= 0.03 * np.abs(exact).max()


ROWS = [1, 2, 3, 4, 5, 8, 9, 13, 17]


@pytest.mark.parametrize("isa", q8_copies())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_row_is_the_same_bits_whatever_the_rows_threads_and_isa(qtype: T, isa: int) -> None:
    """The ``isa`` copy, at every row count and thread count, against the AVX2 copy on all rows."""
    require_q8_copy(isa)
    columns = columns_of(qtype)
    raw = blocks(qtype, 11, columns, 2)
    bias = torch.randn(11)
    x = torch.randn(max(ROWS), columns, generator=torch.Generator().manual_seed(3))
    reference = qlinear(x, [(raw, qtype, bias)], AVX2, threads=1)
    differing = [
        (rows, threads)
        for rows in ROWS
        for threads in (1, 2)
        if not torch.equal(
            qlinear(x[:rows].contiguous(), [(raw, qtype, bias)], isa, threads=threads), reference[:rows]
        )
    ]
    assert not differing


@pytest.mark.parametrize("isa", q8_copies())
@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q4_0, T.Q5_0, T.Q8_0], ids=lambda t: t.name)
def test_repacked_groups_exact_same_bits_on_every_isa_and_row_count(qtype: T, isa: int) -> None:
    """37 outputs: two whole groups of 16 and a padded one; rows past a tile (6 on AVX-512, 2 on AVX2);
    legacy types a partial last activation block. The ``isa`` copy against the AVX2 copy."""
    require_q8_copy(isa)
    columns = columns_of(qtype)
    raw = blocks(qtype, 37, columns, 11)
    w = np.asarray(dequantize(raw, qtype), dtype=np.float64).reshape(37, columns)
    x = torch.randn(9, columns, generator=torch.Generator().manual_seed(12))
    bias = torch.randn(37)
    reference = run_packed(x, raw, qtype, AVX2, threads=1, bias=bias)
    expected = quantised(x.numpy()) @ w.T + bias.numpy()
    assert np.abs(reference.double().numpy() - expected).max() <= 1e-5 * np.abs(expected).max()
    differing = [
        (rows, threads)
        for rows in (1, 2, 3, 5, 6, 7, 9)
        for threads in (1, 2)
        if not torch.equal(
            run_packed(x[:rows].contiguous(), raw, qtype, isa, threads, bias), reference[:rows]
        )
    ]
    assert not differing


@pytest.mark.parametrize("isa", q8_copies())
def test_parts_norm_and_residual_in_one_call(isa: int) -> None:
    """q/k/v-like parts of two types, the RMSNorm before and the residual add after: the ``isa`` copy
    gives the AVX2 copy's bits, and the values of the separate steps (the norm's sum order is the
    kernel's own)."""
    require_q8_copy(isa)
    columns = 512
    parts = [
        (blocks(T.Q4_K, 12, columns, 4), T.Q4_K, torch.randn(12)),
        (blocks(T.Q6_K, 5, columns, 5), T.Q6_K, None),
    ]
    x = torch.randn(6, columns) * 3
    norm = torch.rand(columns) + 0.5
    residual = torch.randn(6, 17)
    fused = qlinear(x, parts, isa, norm=norm, out=residual.clone())
    assert torch.equal(fused, qlinear(x, parts, AVX2, norm=norm, out=residual.clone()))
    normed = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm
    separate = residual + qlinear(normed, parts, isa)
    assert torch.allclose(fused, separate, rtol=1e-3, atol=1e-3 * float(separate.abs().max()))


def test_the_layer_picks_the_integer_path_by_type_and_width() -> None:
    k = QuantBlocks(int(T.Q4_K), torch.from_numpy(blocks(T.Q4_K, 4, 512, 6)), 512)
    legacy = QuantBlocks(int(T.Q5_0), torch.from_numpy(blocks(T.Q5_0, 4, 96, 7)), 96)  # 96: not whole chunks
    q41 = QuantBlocks(int(T.Q4_1), torch.from_numpy(blocks(T.Q4_1, 4, 512, 8)), 512)
    assert integer_path([k], 512) and not integer_path([k], 0)
    assert not integer_path([legacy], 512) and not integer_path([k, q41], 512)
    layer = GGUFLinear([k])
    x = torch.randn(3, 512)
    residual = torch.randn(3, 4)
    same = residual.clone()
    assert layer.fused(x, residual=same) is same  # added in place
    assert torch.allclose(same, residual + layer(x), rtol=1e-6, atol=1e-6)


def test_the_kernel_reports_the_copies_this_cpu_has() -> None:
    """What ``q8_copy`` says runs agrees with the CPU's own flags (/proc/cpuinfo), so a skip above is
    a copy really missing and a pass a copy really run."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = set(next(line for line in lines if line.startswith("flags")).split())
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to compare with")
    avx512 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    assert (q8_copy(512) == 512) == (avx512 and "avx512_vnni" in flags)
    assert (q8_copy(256) == 256) == ("avx_vnni" in flags)
    assert q8_copy(2) == 2  # the module runs only where the AVX2 copy does
    assert all(q8_copy(isa) <= isa for isa in ISAS)


def test_bad_plans_are_refused() -> None:
    raw = blocks(T.Q4_K, 2, 256, 9)
    x = torch.randn(1, 256)
    with pytest.raises(ValueError, match="bad plan"):
        qlinear(x, [(raw, T.Q4_1, None)], AVX2)  # a type the integer path does not take
    with pytest.raises(ValueError, match="bad plan"):
        qlinear(torch.randn(1, 512), [(raw, T.Q4_K, None)], AVX2)  # row bytes of another width
