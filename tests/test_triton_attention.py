"""The Triton paged-attention kernel (run by Triton's interpreter on CPU, see conftest.py) and its
torch reference, against a plain per-row loop: ragged lengths (0, 1, block boundaries), 1 and 5
query rows per sequence, GQA 7 and 6, one and several key splits, padding rows."""

from __future__ import annotations

import pytest
import torch
from required_builds import triton
from trispec.engine.gpu import triton_attention
from trispec.engine.gpu.static_attention import reference_paged_attention

triton()  # a failure where the test extra installs it, else a skip (required_builds.py)

# the interpreter turns loop bounds into ints through a deprecated numpy conversion
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array:DeprecationWarning")

BS = 16  # block size
D = 16  # head dim: the smallest tl.dot takes


def make_case(heads: int, kv_heads: int, seq_lens: list[int], q: int, dtype: torch.dtype, garbage: float):
    """A pool whose blocks are handed out shuffled; block 0 is the trash block (table padding),
    and every slot no sequence owns holds ``garbage``."""
    g = torch.Generator().manual_seed(len(seq_lens) * 31 + q)
    B = len(seq_lens)
    max_blocks = max(-(-n // BS) for n in seq_lens) + 1
    num_blocks = 1 + B * max_blocks
    k = torch.full((kv_heads, num_blocks * BS, D), garbage)
    v = torch.full((kv_heads, num_blocks * BS, D), garbage)
    order = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = torch.zeros(B, max_blocks, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        for i in range(-(-n // BS)):
            block = order.pop()
            tables[b, i] = block
            used = min(BS, n - i * BS)
            k[:, block * BS : block * BS + used] = torch.randn(kv_heads, used, D, generator=g)
            v[:, block * BS : block * BS + used] = torch.randn(kv_heads, used, D, generator=g)
    q_lens = torch.tensor([min(q, n) for n in seq_lens], dtype=torch.int32)
    queries = torch.randn(B * q, heads, D, generator=g)
    return (
        queries.to(dtype),
        k.to(dtype),
        v.to(dtype),
        tables,
        torch.tensor(seq_lens, dtype=torch.int32),
        q_lens,
    )


def loop_reference(q, k, v, tables, seq_lens, q_lens, scale):
    """One row, one head at a time, reading only the keys the row may see (float64)."""
    rows, H, _ = q.shape
    B, KV = tables.shape[0], k.shape[0]
    Q, G = rows // B, H // KV
    out = torch.zeros(rows, H, D, dtype=torch.float64)
    for b in range(B):
        n, ql = int(seq_lens[b]), int(q_lens[b])
        slots = [int(tables[b, t // BS]) * BS + t % BS for t in range(n)]
        for j in range(ql):
            seen = slots[: n - ql + j + 1]
            for h in range(H):
                keys, values = k[h // G, seen].double(), v[h // G, seen].double()
                weights = torch.softmax(keys @ q[b * Q + j, h].double() * scale, 0)
                out[b * Q + j, h] = weights @ values
    return out.view(rows, H * D)


CASES = [
    # heads, kv heads, lengths, rows per sequence
    pytest.param(14, 2, [0, 1, 16, 17, 40], 5, id="gqa7-q5"),
    pytest.param(14, 2, [1, 15, 32, 33, 0], 1, id="gqa7-q1"),
    pytest.param(12, 2, [5, 16, 48, 0], 5, id="gqa6-q5"),
]


@pytest.mark.parametrize(("heads", "kv_heads", "lengths", "q"), CASES)
@pytest.mark.parametrize("splits", [1, 4])
def test_kernel_matches_a_per_row_loop(
    heads: int, kv_heads: int, lengths: list[int], q: int, splits: int
) -> None:
    # NaN in every slot no sequence owns: a kernel reading past a length or through a padded table
    # entry would spread it
    case = make_case(heads, kv_heads, lengths, q, torch.float32, float("nan"))
    scale = D**-0.5
    out = triton_attention.paged_attention(*case, block_size=BS, scale=scale, splits=splits, block_n=16)
    expected = loop_reference(*case, scale)
    assert torch.allclose(out.double(), expected, atol=1e-5, rtol=1e-5)
    # padding rows (a sequence's rows past its q_len, and whole padding sequences) are zeros
    q_lens, B = case[5], len(lengths)
    pad = torch.tensor([j >= int(q_lens[b]) for b in range(B) for j in range(q)])
    assert pad.any() and torch.equal(out[pad], torch.zeros_like(out[pad]))


def test_kernel_in_bf16_upcast_is_close_to_float64() -> None:
    case = make_case(14, 2, [3, 16, 17, 31], 5, torch.bfloat16, 0.0)
    out = triton_attention.paged_attention(*case, block_size=BS, scale=D**-0.5, upcast=True, block_n=16)
    assert out.dtype == torch.bfloat16
    expected = loop_reference(*case, D**-0.5)
    assert (out.double() - expected).abs().max() / expected.abs().max() < 1e-2


@pytest.mark.parametrize(("heads", "kv_heads", "lengths", "q"), CASES)
def test_torch_reference_matches_a_per_row_loop(
    heads: int, kv_heads: int, lengths: list[int], q: int
) -> None:
    # finite garbage: the reference gathers whole table rows and masks (0 * NaN would be NaN)
    case = make_case(heads, kv_heads, lengths, q, torch.float32, 1e4)
    out = reference_paged_attention(*case, block_size=BS, scale=D**-0.5)
    assert torch.allclose(out.double(), loop_reference(*case, D**-0.5), atol=1e-5, rtol=1e-5)


def test_splits_depend_on_the_padded_batch_only() -> None:
    assert triton_attention.splits_for(1, 4) == 16
    assert triton_attention.splits_for(32, 4) == 1
    assert triton_attention.splits_for(8, 2) == 8  # 128 programs
