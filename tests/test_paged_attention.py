"""The paged attention kernel (``engine/cpu/csrc/paged_attention.c``) against a float64 reference
written here (softmax(q k^T * scale) v over each row's own keys, read through its block table), on
shapes that reach every branch of it: one row and many, partial key blocks, GQA groups that do not
fill its groups of four, head sizes 16 to 256, bf16 caches; and every ISA copy the CPU runs gives
the same bits."""

from __future__ import annotations

import pytest
import torch
from trispec.engine.attention import SeqRows
from trispec.engine.cpu import paged_attention
from trispec.engine.cpu.paged_attention import PagedAttention

pytestmark = pytest.mark.skipif(not paged_attention.kernel_built(), reason="the extension is not built")

# (heads, kv heads, head dim, block size, [(rows, keys of the last row), ...], dtype)
CASES = [
    (12, 2, 128, 16, [(1, 500)], torch.float32),
    (12, 2, 128, 16, [(1, 1), (1, 17)], torch.float32),
    (9, 3, 64, 8, [(5, 37), (3, 3)], torch.float32),
    (14, 2, 64, 16, [(40, 40)], torch.float32),
    (4, 4, 16, 4, [(2, 33)], torch.float32),
    (8, 1, 256, 32, [(3, 130)], torch.float32),
    (9, 3, 64, 8, [(4, 70), (1, 5)], torch.bfloat16),
]


def run_case(
    heads: int,
    kv_heads: int,
    dim: int,
    bs: int,
    seqs: list[tuple[int, int]],
    dtype: torch.dtype,
    isa: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(heads * 1000 + dim)
    slots = 64 * bs
    k_cache = torch.randn(kv_heads, slots, dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, slots, dim, generator=gen).to(dtype)
    order = torch.randperm(slots // bs, generator=gen).tolist()
    attention = PagedAttention(heads, kv_heads, dim, dim**-0.5)
    if isa is not None:
        attention.isa = isa
    rows, t0, used = [], 0, 0
    for n, keys in seqs:
        blocks = (keys + bs - 1) // bs
        rows.append(SeqRows(t0, n, keys - n, order[used : used + blocks]))
        t0, used = t0 + n, used + blocks
    # q rows strided like the fused q|k|v output the engine passes
    q = torch.randn(t0, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)[:, : heads * dim]
    out = attention(attention.plan(rows, bs, dtype), q.view(t0, heads, dim), None, None, k_cache, v_cache)  # type: ignore[arg-type]
    want = torch.empty(t0, heads, dim, dtype=torch.float64)
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
    return out.view(t0, heads, dim), want


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-KV{c[1]}-D{c[2]}-{str(c[5])[6:]}")
def test_the_kernel_gives_softmax_attention(case: tuple) -> None:
    out, want = run_case(*case, isa=None)
    tolerance = 2e-2 if case[5] == torch.bfloat16 else 2e-5  # the output's own rounding
    assert float((out.double() - want).abs().max()) <= tolerance * float(want.abs().max())


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-KV{c[1]}-D{c[2]}-{str(c[5])[6:]}")
def test_every_isa_copy_gives_the_same_bits(case: tuple) -> None:
    top = PagedAttention(case[0], case[1], case[2], 1.0).isa
    if top != 512:
        pytest.skip("one vector ISA copy runs here")
    outs = [run_case(*case, isa=isa)[0] for isa in (512, 2)]
    assert torch.equal(outs[0], outs[1])
