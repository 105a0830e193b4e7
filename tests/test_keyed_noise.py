"""The keyed noise and the coupled rule's perturbed argmax: Philox4x32-10's published answers, the
same bits from the torch formula, the C kernel and the Triton kernel (under the interpreter), the same
tokens from all three whatever the batch, thread count or ISA copy, and the Gumbel-max law."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from isa_copies import copies, require_copy
from required_builds import c_kernel, triton
from scipy.stats import chisquare
from trispec.sampling import coupled
from trispec.sampling.coupled import perturbed_argmax, reference_perturbed_argmax
from trispec.sampling.kept_set import KeptSet, find_kept_sets
from trispec.sampling.noise import gumbel, noise_bits, philox4x32_10

kernel = c_kernel("trispec.sampling._perturbed_argmax")

# Random123's kat_vectors (Salmon et al.): counter, key -> output, Philox4x32 with 10 rounds
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]
SEEDS_AND_POSITIONS = [(0, 0), (2**64 - 1, 2**40 + 5), (12345, 77), (2**63, 2**32 - 1)]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_philox_gives_the_published_answers(counter: tuple, key: tuple, expected: tuple) -> None:
    assert kernel.philox(*counter, *key) == expected
    words = philox4x32_10(tuple(torch.tensor([c]) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize(("seed", "position"), SEEDS_AND_POSITIONS)
def test_the_c_kernel_draws_the_torch_formulas_bits(seed: int, position: int) -> None:
    out = torch.empty(3001, dtype=torch.int32)
    kernel.noise_bits(seed, position, 5, 3001, out.data_ptr())
    expected = noise_bits(seed, position, torch.arange(5, 3006))
    assert torch.equal(out.to(torch.int64) & 0xFFFFFFFF, expected)


def test_noise_depends_on_seed_position_and_token_and_is_gumbel() -> None:
    ids = torch.arange(20000)
    base = gumbel(7, 3, ids)
    assert not torch.equal(base, gumbel(8, 3, ids))
    assert not torch.equal(base, gumbel(7, 4, ids))
    assert torch.equal(base, gumbel(7, 3, ids))
    # Gumbel(0, 1): mean = Euler's gamma, variance pi^2 / 6
    assert abs(float(base.mean()) - 0.5772) < 0.03
    assert abs(float(base.var()) - math.pi**2 / 6) < 0.08


def rows(seed: int, n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=g) * 3
    x[0] = (x[0] * 2).round() / 2  # many exact ties
    if n > 2:
        x[2, ::3] = -math.inf
    return x


SETTINGS = ([0, 40, 0, 5, 1, 0], [1.0, 1.0, 0.9, 0.5, 1.0, 0.3])


@pytest.mark.parametrize("vocab", [7, 300, 4099])
def test_the_c_kernel_picks_the_reference_tokens(vocab: int) -> None:
    x = rows(vocab, 6, vocab)
    kept = find_kept_sets(x, *SETTINGS)
    seeds, positions = [1, 2**63 + 5, 7, 2**64 - 1, 3, 9], [0, 11, 2**33, 5, 1, 400]
    assert torch.equal(
        perturbed_argmax(x, kept, seeds, positions), reference_perturbed_argmax(x, kept, seeds, positions)
    )


@pytest.mark.parametrize(("top_k", "top_p"), [(40, 1.0), (5, 0.9), (0, 0.9), (0, 0.3), (1, 1.0)])
def test_sampling_among_the_candidates_picks_what_the_whole_row_does(top_k: int, top_p: float) -> None:
    """One setting for every row: the kept set comes with its candidates, and the kernel looks only
    at those; the tokens are the whole row's (ties at the cut included)."""
    x = rows(11, 6, 3000)
    x[1] = x[1].round()  # ties at the cut
    kept = find_kept_sets(x, [top_k] * 6, [top_p] * 6)
    seeds, positions = list(range(6)), [9] * 6
    whole_row = KeptSet(kept.threshold, kept.ties)
    for seed_shift in range(20):
        shifted = [s + 100 * seed_shift for s in seeds]
        assert torch.equal(
            perturbed_argmax(x, kept, shifted, positions), perturbed_argmax(x, whole_row, shifted, positions)
        )
    # rows without ties at the cut come with candidates (rows 0 and 1 above may not)
    tie_free = torch.randn(4, 3000, generator=torch.Generator().manual_seed(2)) * 3
    assert find_kept_sets(tie_free, [top_k] * 4, [top_p] * 4).candidates is not None


def test_a_row_gets_its_token_whatever_the_batch() -> None:
    x = rows(3, 6, 5000)
    kept = find_kept_sets(x, *SETTINGS)
    seeds, positions = list(range(6)), [4] * 6
    batched = perturbed_argmax(x, kept, seeds, positions)
    for i in range(6):
        alone = KeptSet(kept.threshold[i : i + 1], kept.ties[i : i + 1])
        assert (
            int(perturbed_argmax(x[i : i + 1], alone, seeds[i : i + 1], positions[i : i + 1])) == batched[i]
        )


@pytest.mark.parametrize("isa", copies())
def test_each_copy_picks_the_torch_formulas_tokens_whatever_the_threads(isa: int) -> None:
    require_copy(kernel, isa)
    x = rows(3, 6, 5000)
    kept = find_kept_sets(x, *SETTINGS)
    seeds, positions = list(range(6)), [4] * 6
    expected = reference_perturbed_argmax(x, kept, seeds, positions)
    seed_words, position_words = torch.tensor(seeds, dtype=torch.int64), torch.tensor(positions)
    for threads in (1, 2):
        out = torch.empty(6, dtype=torch.int64)
        kernel.perturbed_argmax(
            x.data_ptr(), 6, 5000, 5000, kept.threshold.data_ptr(), kept.ties.data_ptr(),
            seed_words.data_ptr(), position_words.data_ptr(), out.data_ptr(), threads, isa, 0, 0,
        )  # fmt: skip
        assert torch.equal(out, expected), threads


# the interpreter's own loop over a range with a tensor bound (triton/runtime/interpreter.py)
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_the_triton_kernel_picks_the_same_tokens() -> None:
    triton()  # installed where the test extra installs it, else a skip (required_builds.py)
    from trispec.sampling import triton_argmax

    x = rows(5, 6, 2500)
    kept = find_kept_sets(x, *SETTINGS)
    seeds, positions = [1, 2**63 + 5, 7, 2**64 - 1, 3, 9], [0, 11, 2**33, 5, 1, 400]
    assert torch.equal(
        triton_argmax.triton_perturbed_argmax(x, kept, seeds, positions),
        perturbed_argmax(x, kept, seeds, positions),
    )


def test_a_row_that_keeps_nothing_is_an_error_not_a_token() -> None:
    x = torch.full((1, 10), math.nan)
    with pytest.raises(ValueError, match="kept no token"):
        coupled.perturbed_argmax(x, find_kept_sets(x, [0], [1.0]), [1], [0])


def test_the_perturbed_argmax_samples_the_softmax() -> None:
    """Gumbel-max: over many seeds, a row's token follows softmax of its values on the kept set."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0, -math.inf, 1.5]])
    n = 20000
    x = logits.expand(n, -1).contiguous()
    kept = find_kept_sets(x, [0] * n, [0.95] * n)
    tokens = perturbed_argmax(x, kept, list(range(n)), [3] * n)
    mask = kept.mask(logits)[0]
    p = torch.softmax(logits[0].masked_fill(~mask, -math.inf).double(), dim=-1).numpy()
    counts = np.bincount(tokens.numpy(), minlength=8)
    assert counts[~mask.numpy()].sum() == 0
    live = p > 0
    assert chisquare(counts[live], p[live] * n).pvalue > 1e-5


def test_ties_past_the_kept_count_are_never_drawn() -> None:
    """A cut inside a run of equal values keeps its lowest ids only: over many seeds, the tokens
    drawn are exactly those kept, and each kept one is drawn."""
    row = torch.tensor([[2.0, 1.0, 5.0, 1.0, 1.0, 0.0, 1.0, 1.0]])
    n = 400
    x = row.expand(n, -1).contiguous()
    kept = find_kept_sets(x, [3] * n, [1.0] * n)  # 2.0, 5.0 and the first 1.0 (id 1)
    tokens = perturbed_argmax(x, kept, list(range(n)), [0] * n)
    assert set(tokens.tolist()) == {0, 1, 2}
    assert torch.equal(tokens, reference_perturbed_argmax(x, kept, list(range(n)), [0] * n))


def test_ties_past_the_cut_are_never_drawn_among_candidates_either() -> None:
    """top-k 4 and top-p 0.8 over 5, 3, 3, 3, 1: the nucleus keeps 5 and ONE of the 3s (the lowest
    id), the candidates (the top 5) are complete, and the kernel looks only at them."""
    row = torch.tensor([[1.0, 3.0, 0.0, 3.0, 5.0, 3.0, -2.0, 0.5]])
    n = 400
    x = row.expand(n, -1).contiguous()
    kept = find_kept_sets(x, [4] * n, [0.8] * n)
    assert kept.candidates is not None
    tokens = perturbed_argmax(x, kept, list(range(n)), [0] * n)
    assert set(tokens.tolist()) == {1, 4}
