"""The paged attention kernel (``engine/cpu/csrc/paged_attention.c``) against a float64 reference
written here (softmax(q k^T * scale) v over each row's own keys, read through its block table), on
shapes that reach every branch of it: one row and many, partial key blocks, GQA groups that do not
fill its groups of four, head sizes 16 to 256, bf16 caches. Each ISA copy (AVX-512, AVX2, baseline:
the test ids name it; a copy this CPU lacks is a skip) is checked against the reference, and the two
vector copies give the same bits (the baseline copy rounds differently: it has no FMA)."""

from __future__ import annotations

import functools

import pytest
import torch
from isa_copies import AVX2, AVX512, copies, require_copy
from required_builds import c_kernel
from trispec.engine.attention import SeqRows
from trispec.engine.cpu.paged_attention import PagedAttention

kernel = c_kernel("trispec.engine.cpu._paged_attention")

# (heads, kv heads, head dim, block size, ((rows, keys of the last row), ...), dtype)
CASES = [
    (12, 2, 128, 16, ((1, 500),), torch.float32),
    (12, 2, 128, 16, ((1, 1), (1, 17)), torch.float32),
    (9, 3, 64, 8, ((5, 37), (3, 3)), torch.float32),
    (14, 2, 64, 16, ((40, 40),), torch.float32),
    (4, 4, 16, 4, ((2, 33),), torch.float32),
    (8, 1, 256, 32, ((3, 130),), torch.float32),
    (9, 3, 64, 8, ((4, 70), (1, 5)), torch.bfloat16),
]
Case = tuple


def case_id(c: Case) -> str:
    return f"H{c[0]}-KV{c[1]}-D{c[2]}-{str(c[5])[6:]}"


@functools.cache
def inputs(case: Case) -> tuple[list[SeqRows], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The case's rows (block tables in a shuffled order), q (strided like the fused q|k|v output the
    engine passes) and the K and V caches."""
    heads, kv_heads, dim, bs, seqs, dtype = case
    gen = torch.Generator().manual_seed(heads * 1000 + dim)
    slots = 64 * bs
    k_cache = torch.randn(kv_heads, slots, dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, slots, dim, generator=gen).to(dtype)
    order = torch.randperm(slots // bs, generator=gen).tolist()
    rows, t0, used = [], 0, 0
    for n, keys in seqs:
        blocks = (keys + bs - 1) // bs
        rows.append(SeqRows(t0, n, keys - n, order[used : used + blocks]))
        t0, used = t0 + n, used + blocks
    q = torch.randn(t0, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)[:, : heads * dim]
    return rows, q, k_cache, v_cache


def attend(case: Case, isa: int) -> torch.Tensor:
    heads, kv_heads, dim, bs, _, dtype = case
    rows, q, k_cache, v_cache = inputs(case)
    attention = PagedAttention(heads, kv_heads, dim, dim**-0.5)
    attention.isa = isa
    out = attention(attention.plan(rows, bs, dtype), q.view(len(q), heads, dim), None, None, k_cache, v_cache)  # type: ignore[arg-type]
    return out.view(len(q), heads, dim)


@functools.cache
def reference(case: Case) -> torch.Tensor:
    heads, kv_heads, dim, bs, _, _ = case
    rows, q, k_cache, v_cache = inputs(case)
    want = torch.empty(len(q), heads, dim, dtype=torch.float64)
    group = heads // kv_heads
    for r in rows:
        keys_at = torch.tensor([r.block_table[p // bs] * bs + p % bs for p in range(r.start + r.n)])
        for i in range(r.n):
            length = r.start + i + 1
            for h in range(heads):
                k = k_cache[h // group, keys_at[:length]].double()
                v = v_cache[h // group, keys_at[:length]].double()
                weights = torch.softmax(k @ q[r.t0 + i, h * dim : (h + 1) * dim].double() * dim**-0.5, 0)
                want[r.t0 + i, h] = weights @ v
    return want


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_copy_gives_softmax_attention(case: Case, isa: int) -> None:
    require_copy(kernel, isa)
    out, want = attend(case, isa), reference(case)
    tolerance = 2e-2 if case[5] == torch.bfloat16 else 2e-5  # the output's own rounding
    assert float((out.double() - want).abs().max()) <= tolerance * float(want.abs().max())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_avx512_copy_gives_the_avx2_copys_bits(case: Case) -> None:
    require_copy(kernel, AVX2)
    require_copy(kernel, AVX512)
    assert torch.equal(attend(case, AVX512), attend(case, AVX2))
