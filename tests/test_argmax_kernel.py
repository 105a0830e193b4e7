"""The greedy token's argmax (``sampling/csrc/argmax_rows.h`` behind ``coupled.greedy_tokens``): the
same ids as torch.argmax, the lowest on ties and the first NaN of a row, one row split between
threads or many rows, in every ISA copy (the test ids name it; a copy this CPU lacks is a skip)."""

from __future__ import annotations

import pytest
import torch
from isa_copies import copies, require_copy
from required_builds import c_kernel
from trispec.sampling import coupled

kernel = c_kernel("trispec.sampling._perturbed_argmax")


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


KINDS = ["random", "ties", "all equal", "-inf", "nan", "max last"]
SHAPES = [(1, 1), (1, 17), (1, 4096), (1, 151_936), (3, 5000), (2, 33)]


def case(kind: str, shape: tuple[int, int]) -> tuple[torch.Tensor, list[int]]:
    gen = torch.Generator().manual_seed(len(kind) * 1_000_003 + shape[0] * 7 + shape[1])
    x = rows_of(kind, *shape, gen)
    return x, x.argmax(-1).tolist()


@pytest.mark.parametrize("isa", copies())
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_each_copy_gives_torch_argmax(kind: str, shape: tuple[int, int], isa: int) -> None:
    require_copy(kernel, isa)
    x, want = case(kind, shape)
    for threads in (1, 2, 3):
        assert kernel.argmax(x.data_ptr(), *shape, shape[1], threads, isa) == want, threads


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_tokens_gives_torch_argmax(kind: str, shape: tuple[int, int]) -> None:
    """What the engine calls: the copy torch's ISA level picks (``cpu_isa.isa_level``)."""
    x, want = case(kind, shape)
    assert coupled.greedy_tokens(x) == want


def test_strided_rows_and_views() -> None:
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    view = x[:, :257]  # rows of 257 values, 300 apart
    assert coupled.greedy_tokens(view) == view.argmax(-1).tolist()
    assert coupled.greedy_tokens(x[1:2]) == x[1:2].argmax(-1).tolist()
    assert coupled.greedy_tokens(x.t()) == x.t().argmax(-1).tolist()  # not row-contiguous: argmax_rows
    assert coupled.greedy_tokens(torch.empty(0, 5)) == []
