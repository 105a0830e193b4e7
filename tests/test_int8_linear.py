"""The int8 weight-only linear kernel (``csrc/int8_linear.c``): right, and batch-invariant by
construction.

Checked against a float64 reference, and row by row against the same rows computed alone, over row
counts that cross every tile shape of both of its paths (streaming below BUFFER_ROWS rows, weights
converted into a buffer from there, rows blocked by how many fit in L2), odd K (a tail after the
vectors), odd N (columns outside a whole tile), 1 or 2 threads, float32 and bfloat16 activations,
in each ISA copy (the test ids name it; a copy this CPU lacks is a skip). The AVX2 and AVX-512 copies
promise the same bits (the same lanes in the same order); the baseline copy rounds differently (no FMA)
and is checked on its own.
"""

from __future__ import annotations

import pytest
import torch
from isa_copies import AVX2, AVX512, copies, require_copy
from required_builds import c_kernel
from trispec.engine.cpu import linear as linear_module
from trispec.engine.cpu.linear import Int8Linear, quantize_per_channel

kernel = c_kernel("trispec.engine.cpu._int8_linear")

BUFFER_ROWS = 16  # the kernel's switch to its buffered path (int8_linear.c)


def run(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    isa: int,
    threads: int = 2,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    rows, features = x.shape
    out = torch.empty(rows, q.shape[0], dtype=out_dtype or x.dtype)
    kernel.linear(
        x.data_ptr(),
        q.data_ptr(),
        scale.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        out.data_ptr(),
        rows,
        features,
        q.shape[0],
        int(x.dtype == torch.bfloat16),
        int(out.dtype == torch.bfloat16),
        threads,
        isa,
    )
    return out


def layer(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return quantize_per_channel(torch.randn(out_features, in_features, generator=g) * 0.05)


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    y = x.double() @ q.double().T * scale.double()
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize(("features", "out_features"), [(64, 40), (70, 13), (896, 37), (4864, 9)])
def test_matches_the_float64_reference(features: int, out_features: int, isa: int) -> None:
    require_copy(kernel, isa)
    q, scale = layer(out_features, features)
    bias = torch.randn(out_features)
    x = torch.randn(21, features)
    got = run(x, q, scale, bias, isa=isa)
    expected = reference(x, q, scale, bias)
    # float32 accumulation over up to 4864 products of O(1) terms
    assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4 * features**0.5)


@pytest.mark.parametrize("isa", copies())
def test_bfloat16_in_and_out(isa: int) -> None:
    require_copy(kernel, isa)
    q, scale = layer(24, 96)
    x = torch.randn(5, 96).bfloat16()
    got = run(x, q, scale, isa=isa)
    assert got.dtype == torch.bfloat16
    # the activations as given, the accumulation in float32, one rounding of the output
    assert torch.equal(got, run(x.float(), q, scale, isa=isa).bfloat16())


# row counts around every tile boundary of both paths, and past one row block of x (K = 4864 holds
# 48 rows per megabyte)
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 9, 15, 16, 17, 22, 23, 30, 49, 61, 100]


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize(("features", "out_features"), [(70, 13), (896, 40), (4864, 10)])
def test_every_row_is_the_same_bits_whatever_shares_the_call(
    features: int, out_features: int, isa: int
) -> None:
    require_copy(kernel, isa)
    q, scale = layer(out_features, features, seed=1)
    x = torch.randn(max(ROW_COUNTS), features, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([run(x[i : i + 1].contiguous(), q, scale, isa=isa) for i in range(len(x))])
    for rows in ROW_COUNTS:
        together = run(x[:rows].contiguous(), q, scale, isa=isa)
        assert torch.equal(together, alone[:rows]), f"{rows} rows"
        # a row at the end of a call, after others: the remainder tiles
        last = x[rows - 1 : 2 * rows - 1].contiguous()
        tail = run(last, q, scale, isa=isa) if 2 * rows - 1 <= len(x) else None
        if tail is not None:
            assert torch.equal(tail[0], alone[rows - 1]), f"row {rows - 1} first of {rows}"


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize("rows", [1, 6, BUFFER_ROWS + 3])
def test_the_thread_count_changes_nothing(rows: int, isa: int) -> None:
    require_copy(kernel, isa)
    q, scale = layer(45, 320)
    x = torch.randn(rows, 320)
    assert torch.equal(run(x, q, scale, isa=isa, threads=1), run(x, q, scale, isa=isa, threads=2))
    assert torch.equal(run(x, q, scale, isa=isa, threads=3), run(x, q, scale, isa=isa, threads=2))


@pytest.mark.parametrize("rows", [1, 3, BUFFER_ROWS, 40])
def test_the_avx512_copy_gives_the_avx2_copys_bits(rows: int) -> None:
    require_copy(kernel, AVX2)
    require_copy(kernel, AVX512)
    q, scale = layer(37, 200)
    x = torch.randn(rows, 200)
    assert torch.equal(run(x, q, scale, isa=AVX2), run(x, q, scale, isa=AVX512))


def test_int8_linear_uses_the_kernel_and_agrees_with_torch() -> None:
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(3)) * 0.05
    bias = torch.randn(48)
    layer_ = Int8Linear.from_float(weight, bias, dtype=torch.float32)
    x = torch.randn(6, 128)
    got = layer_(x)
    # the copy torch's ISA level picks (cpu_isa.isa_level)
    expected = run(x, layer_.weight, layer_._scales_f32, layer_._bias_f32, isa=linear_module._INT8_ISA)
    assert torch.equal(got, expected)
    # torch's own int8 kernel, the fallback without the extension, computes the same layer
    fallback = torch._weight_int8pack_mm(x, layer_.weight, layer_.scales) + bias
    assert torch.allclose(got, fallback, rtol=1e-4, atol=1e-4)
