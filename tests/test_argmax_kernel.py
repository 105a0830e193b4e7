"""The greedy token's argmax (``sampling/csrc/argmax_rows.h`` behind ``coupled.greedy_tokens``): the
same ids as torch.argmax, the lowest on ties and the first NaN of a row, one row split between
threads or many rows, in every ISA copy."""

from __future__ import annotations

import pytest
import torch
from trispec.sampling import coupled

kernel = coupled._kernel
pytestmark = pytest.mark.skipif(kernel is None or not hasattr(kernel, "argmax"), reason="not built")


def rows_of(kind: str, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(n, vocab, generator=gen)
    if kind == "ties":
        x = torch.round(x * 2) / 2
    elif kind == "all equal":
        x = torch.full((n, vocab), 3.0)
    elif kind == "-inf":
        x = torch.full((n, vocab), float("-inf"))
    elif kind == "nan":
        x[:, torch.randint(0, vocab, (2,), generator=gen)] = float("nan")
    elif kind == "max last":
        x[:, -1] = 100.0
    return x


@pytest.mark.parametrize("kind", ["random", "ties", "all equal", "-inf", "nan", "max last"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 17), (1, 4096), (1, 151_936), (3, 5000), (2, 33)])
def test_the_kernel_gives_torch_argmax(kind: str, shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(len(kind) * 1_000_003 + shape[0] * 7 + shape[1])
    x = rows_of(kind, *shape, gen)
    want = x.argmax(-1).tolist()
    for isa in (512, 2, 0):
        for threads in (1, 2, 3):
            assert kernel.argmax(x.data_ptr(), *shape, shape[1], threads, isa) == want, (isa, threads)
    assert coupled.greedy_tokens(x) == want


def test_strided_rows_and_views() -> None:
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    view = x[:, :257]  # rows of 257 values, 300 apart
    assert coupled.greedy_tokens(view) == view.argmax(-1).tolist()
    assert coupled.greedy_tokens(x[1:2]) == x[1:2].argmax(-1).tolist()
    assert coupled.greedy_tokens(x.t()) == x.t().argmax(-1).tolist()  # not row-contiguous: argmax_rows
    assert coupled.greedy_tokens(torch.empty(0, 5)) == []
