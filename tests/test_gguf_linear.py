"""The GGUF-block linear kernel (``csrc/gguf_linear.c``): the file's own values, right, and
batch-invariant by construction.

Decoding is checked bit for bit against gguf-py's dequantize (what the dense path loads) for every
type the kernel reads, including float16 scales that are zero or subnormal. The matmul is checked
against a float64 reference, and row by row against the same rows computed alone, over row counts
that cross both of its paths (streaming up to 5 rows, buffered from 6, 4-row tiles and their
remainders), column counts that leave partial tiles, K over several chunks, 1 or 2 threads, and its
AVX-512, AVX2 and baseline copies, which promise the same bits (the test ids name the copy; a copy
this CPU lacks is a skip).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize
from gguf_files import K_QUANTS, QUANTISABLE, T, random_blocks
from isa_copies import AVX2, BASELINE, copies, require_copy
from required_builds import c_kernel
from trispec.engine.cpu import gguf_linear
from trispec.engine.cpu.linear import GGUFLinear, gguf_rows, gguf_supported
from trispec.engine.cpu.quant_blocks import QuantBlocks

kernel = c_kernel("trispec.engine.cpu._gguf_linear")

TYPES = [*QUANTISABLE, *K_QUANTS, T.F16]
# the copy the engine runs (torch's ISA level, lowered to what this CPU has): the checks of values
# below run it; the checks of bits run every copy
ENGINE_COPY = gguf_linear._GGUF_ISA


def blocks(qtype: T, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """``[rows, row_bytes]`` of ``qtype``: quantised random floats (with a zero, a signed zero and
    values in float16's subnormal range) or, for K-quants, random valid blocks."""
    if qtype in K_QUANTS:
        return np.ascontiguousarray(random_blocks(qtype, rows, columns, seed))
    w = (np.random.default_rng(seed).standard_normal((rows, columns)) * 0.05).astype(np.float32)
    w[0, :4] = [0.0, -0.0, 1e-6, 7e-8]
    if qtype == T.F16:
        return np.ascontiguousarray(w.astype(np.float16).view(np.uint8))
    from gguf.quants import quantize

    return np.ascontiguousarray(quantize(w, qtype))


def values(raw: np.ndarray, qtype: T, columns: int) -> np.ndarray:
    return np.asarray(dequantize(raw, qtype), dtype=np.float32).reshape(raw.shape[0], columns)


def decode(raw: np.ndarray, qtype: T, columns: int, isa: int) -> np.ndarray:
    out = np.empty((raw.shape[0], columns), dtype=np.float32)
    kernel.dequantize(
        raw.ctypes.data, int(qtype), 0, raw.shape[0], columns, out.ctypes.data, raw.shape[1], isa
    )
    return out


def run(
    x: torch.Tensor, raw: np.ndarray, qtype: T, *, isa: int = ENGINE_COPY, threads: int = 2, bias=None
) -> torch.Tensor:
    rows, columns = x.shape
    out = torch.empty(rows, raw.shape[0])
    kernel.linear(
        x.data_ptr(),
        raw.ctypes.data,
        int(qtype),
        0 if bias is None else bias.data_ptr(),
        out.data_ptr(),
        rows,
        columns,
        raw.shape[0],
        raw.shape[1],
        raw.shape[0],
        threads,
        isa,
    )
    return out


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", copies(AVX2, BASELINE))  # decoding has no AVX-512 copy
def test_decodes_the_values_gguf_py_gives_bit_for_bit(qtype: T, isa: int) -> None:
    require_copy(kernel, isa)
    raw = blocks(qtype, 5, 512)
    got, expected = decode(raw, qtype, 512, isa), values(raw, qtype, 512)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("isa", copies(AVX2, BASELINE))
def test_bfloat16_rows_decode_exactly(isa: int) -> None:
    require_copy(kernel, isa)
    w = torch.randn(3, 64).bfloat16()
    raw = np.ascontiguousarray(w.view(torch.int16).numpy().view(np.uint8))
    assert torch.equal(torch.from_numpy(decode(raw, T.BF16, 64, isa)), w.float())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matches_the_float64_reference(qtype: T) -> None:
    columns = 1536 if qtype in K_QUANTS else 1056  # several 512-value chunks, and a partial one
    raw = blocks(qtype, 37, columns, seed=1)
    w = torch.from_numpy(values(raw, qtype, columns)).double()
    bias = torch.randn(37)
    x = torch.randn(9, columns)
    got = run(x, raw, qtype, bias=bias).double()
    expected = x.double() @ w.T + bias.double()
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))


# both paths (streaming <= 5 rows, buffered >= 6), every remainder of a 4-row tile, one row past a
# row block; output counts leaving every partial width of the buffered tiles (3 columns on AVX2, 4
# on AVX-512), with one thread and with the columns split between two
ROWS = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 16, 45]
OUTPUTS = [13, 14, 15, 18]


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_row_is_the_same_bits_whatever_the_rows_threads_and_isa(qtype: T, isa: int) -> None:
    """The ``isa`` copy, at every row and thread count, against the baseline copy on all rows."""
    require_copy(kernel, isa)
    columns = 768 if qtype in K_QUANTS else 544
    x = torch.randn(max(ROWS), columns, generator=torch.Generator().manual_seed(3))
    differing = []
    for outputs in OUTPUTS:
        raw = blocks(qtype, outputs, columns, seed=2)
        bias = torch.randn(outputs)
        reference = run(x, raw, qtype, isa=BASELINE, bias=bias)
        for rows in ROWS:
            for threads in (1, 2):
                got = run(x[:rows].contiguous(), raw, qtype, isa=isa, threads=threads, bias=bias)
                if not torch.equal(got, reference[:rows]):
                    differing.append((outputs, rows, threads))
    assert not differing


def test_the_invariance_check_can_fail() -> None:
    """The comparison above is sharp: the same products summed in torch's order give other bits."""
    raw = blocks(T.Q4_K, 13, 768, seed=2)
    x = torch.randn(7, 768)
    ours = run(x, raw, T.Q4_K)
    theirs = x @ torch.from_numpy(values(raw, T.Q4_K, 768)).T
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4)
    assert not torch.equal(ours, theirs)


def test_bad_shapes_and_types_are_refused() -> None:
    raw = blocks(T.Q8_0, 4, 64)
    x = torch.randn(1, 64)
    out = torch.empty(1, 4)
    with pytest.raises(ValueError, match="unsupported ggml type"):
        kernel.linear(x.data_ptr(), raw.ctypes.data, 10, 0, out.data_ptr(), 1, 64, 4, raw.shape[1], 4, 1, 2)
    with pytest.raises(ValueError, match="do not fit"):  # row bytes of another width
        kernel.linear(
            x.data_ptr(), raw.ctypes.data, int(T.Q8_0), 0, out.data_ptr(), 1, 96, 4, raw.shape[1], 4, 1, 2
        )


# -- the Python side --------------------------------------------------------------------------------


def quant(qtype: T, rows: int, columns: int, seed: int) -> QuantBlocks:
    return QuantBlocks(int(qtype), torch.from_numpy(blocks(qtype, rows, columns, seed)), columns)


def test_fused_parts_of_different_types_equal_each_part_alone() -> None:
    """q, k and v of a layer in three types (as llama.cpp mixes them): one layer, each part's columns
    as that part computed alone, bias included."""
    parts = [
        quant(T.Q4_K, 12, 512, 1),
        quant(T.Q4_K, 4, 512, 2),
        quant(T.Q6_K, 4, 512, 3),
        quant(T.Q8_0, 5, 512, 4),
    ]
    bias = torch.randn(25)
    fused = GGUFLinear(parts, bias)
    assert [p.ggml_type for p in fused.parts] == [int(T.Q4_K), int(T.Q6_K), int(T.Q8_0)]  # like ones joined
    x = torch.randn(3, 512)
    y = fused(x)
    first = 0
    for p in parts:
        alone = GGUFLinear([p], bias[first : first + p.rows])(x)
        assert torch.equal(y[:, first : first + p.rows], alone)
        first += p.rows
    assert first == fused.out_features == y.shape[1]


def test_embedding_rows_are_the_files_values() -> None:
    table = quant(T.Q6_K, 50, 256, 5)
    ids = torch.tensor([7, 0, 49, 7])
    expected = values(table.data.numpy(), T.Q6_K, 256)[ids.numpy()]
    assert np.array_equal(gguf_rows(table, ids).numpy(), expected)


def test_what_the_kernel_does_not_decode_is_reported() -> None:
    assert gguf_supported(quant(T.Q4_K, 2, 256, 0))
    assert not gguf_supported(None)
    q2k = QuantBlocks(int(T.Q2_K), torch.zeros(2, 84, dtype=torch.uint8), 256)
    assert not gguf_supported(q2k)
    with pytest.raises(ValueError):
        GGUFLinear([q2k])
    with pytest.raises(ValueError, match="float32"):
        GGUFLinear([quant(T.Q8_0, 2, 64, 0)])(torch.randn(1, 64).bfloat16())
