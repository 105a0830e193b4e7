"""Sampling transforms: temperature, top-k, top-p, greedy, seeded generators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from trispec.errors import InvalidInputError
from trispec.sampling import SamplingParams, logits_to_probs, make_generator, one_hot_probs, sample


def _logits_of(probs: list[float]) -> torch.Tensor:
    """One row of logits whose softmax is ``probs`` (log of the probabilities)."""
    return torch.tensor([probs], dtype=torch.float64).log().float()


def _kept(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0] > 0).flatten().tolist()


# --- params -------------------------------------------------------------------------------------


def test_greedy_property() -> None:
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5, top_p=0.5).greedy
    assert not SamplingParams(temperature=1e-3).greedy


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": 1.0}, "seed"),
        ({"top_k": True}, "top_k"),
        ({"temperature": "0.7"}, "temperature"),
    ],
)
def test_invalid_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field


def test_numpy_scalars_are_accepted_and_stored_as_builtins() -> None:
    # Triton hands request values over as numpy arrays.
    params = SamplingParams(
        temperature=np.float32(0.5), top_k=np.int32(3), top_p=np.float64(0.9), seed=np.uint64(7)
    )
    values = (params.temperature, params.top_k, params.top_p, params.seed)
    assert [type(v) for v in values] == [float, int, float, int]
    assert params == SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=7)
    assert SamplingParams(top_k=2).top_k == 2 and SamplingParams(temperature=1).temperature == 1.0


def test_extreme_seeds_work() -> None:
    for seed in (0, 2**63, 2**64 - 1):
        assert isinstance(make_generator(SamplingParams(temperature=1.0, seed=seed)), torch.Generator)


# --- temperature --------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_logits(temperature: float) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0], [0.5, 0.5, 4.0, -2.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=temperature))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))


def test_temperature_sharpens_and_flattens() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = logits_to_probs(logits, SamplingParams(temperature=0.5))
    warm = logits_to_probs(logits, SamplingParams(temperature=2.0))
    assert cold[0, 0] > torch.softmax(logits, -1)[0, 0] > warm[0, 0]


def test_non_float32_logits_come_back_float32() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.bfloat16)
    assert logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2)).dtype == torch.float32
    assert logits_to_probs(logits, SamplingParams()).dtype == torch.float32


# --- top-k --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_keeps_exactly_k_renormalised(k: int) -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 0.5, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=k))
    top = torch.argsort(logits[0], descending=True)[:k].tolist()
    assert sorted(_kept(probs)) == sorted(top)
    # Renormalised softmax over the kept logits.
    expected = torch.softmax(logits[0, top], dim=-1)
    torch.testing.assert_close(probs[0, top], expected)


def test_top_k_ties_keep_exactly_k_lowest_ids() -> None:
    # Four tokens tie for the top; k=2 must keep exactly two, the lowest ids (as argmax would).
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 3.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert _kept(probs) == [1, 2]
    torch.testing.assert_close(probs[0, [1, 2]], torch.tensor([0.5, 0.5]))


def test_top_k_at_least_vocab_is_off() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0]])
    off = logits_to_probs(logits, SamplingParams(temperature=1.0))
    for k in (4, 10):
        torch.testing.assert_close(logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=k)), off)


def test_top_k_is_per_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [[False, False, True, True], [True, True, False, False]]


# --- top-p --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.01, [0]),  # below the top token's mass: the top token alone
        (0.45, [0]),
        (0.55, [0, 1]),  # 0.5 < 0.55: needs the second token
        (0.75, [0, 1]),
        (0.85, [0, 1, 2]),
        (0.97, [0, 1, 2, 3]),
    ],
)
def test_top_p_keeps_minimal_nucleus(top_p: float, kept: list[int]) -> None:
    mass = [0.5, 0.3, 0.15, 0.04, 0.01]
    # Shuffle the ids so the nucleus is found by probability, not by position.
    order = [3, 0, 4, 1, 2]
    probs_in = [0.0] * 5
    for rank, token in enumerate(order):
        probs_in[token] = mass[rank]
    probs = logits_to_probs(_logits_of(probs_in), SamplingParams(temperature=1.0, top_p=top_p))
    expected_ids = sorted(order[r] for r in kept)
    assert _kept(probs) == expected_ids
    kept_mass = sum(mass[r] for r in kept)
    assert kept_mass >= top_p
    assert kept_mass - mass[kept[-1]] < top_p  # minimal: dropping the last kept token falls short
    for rank in kept:
        assert probs[0, order[rank]].item() == pytest.approx(mass[rank] / kept_mass, rel=1e-5)


def test_top_p_always_keeps_top_token_even_when_flat() -> None:
    # Uniform over 4: top_p tiny still keeps one token (the lowest id on the tie).
    probs = logits_to_probs(torch.zeros(1, 4), SamplingParams(temperature=1.0, top_p=1e-6))
    assert _kept(probs) == [0]
    assert probs[0, 0].item() == 1.0


def test_top_p_applies_after_top_k_on_the_renormalised_distribution() -> None:
    # top-k=2 leaves [0.4, 0.3] -> renormalised [4/7, 3/7]; top_p=0.5 is then reached by token 0
    # alone. Applied to the raw distribution (0.4 < 0.5) it would have kept two tokens.
    logits = _logits_of([0.4, 0.3, 0.2, 0.1])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2, top_p=0.5))
    assert _kept(probs) == [0]
    only_top_p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert _kept(only_top_p) == [0, 1]


def test_top_p_applies_after_temperature() -> None:
    # At T=1 token 0 holds 0.5 of the mass; top_p=0.6 needs two tokens. At T=0.25 the top token
    # holds about 0.87, so it is alone.
    logits = _logits_of([0.5, 0.3, 0.2])
    assert _kept(logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.6))) == [0, 1]
    assert _kept(logits_to_probs(logits, SamplingParams(temperature=0.25, top_p=0.6))) == [0]


def test_filtered_rows_sum_to_one() -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 50) * 3
    probs = logits_to_probs(logits, SamplingParams(temperature=0.8, top_k=20, top_p=0.9))
    torch.testing.assert_close(probs.sum(-1), torch.ones(16))
    assert ((probs > 0).sum(-1) <= 20).all()
    assert ((probs > 0).sum(-1) >= 1).all()


# --- greedy -------------------------------------------------------------------------------------


def test_greedy_is_one_hot_argmax_with_lowest_id_on_ties() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0], [5.0, -1.0, 5.0, 0.0], [-3.0, -2.0, -1.0, -1.5]])
    probs = logits_to_probs(logits, SamplingParams(top_k=1, top_p=0.3))  # filters ignored when greedy
    expected = torch.zeros(3, 4)
    expected[0, 1] = expected[1, 0] = expected[2, 2] = 1.0
    assert torch.equal(probs, expected)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))


def test_one_hot_probs() -> None:
    probs = one_hot_probs([2, 0, 2], 4)
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert one_hot_probs([], 4).shape == (0, 4)


# --- generators and sampling --------------------------------------------------------------------


def test_greedy_has_no_generator() -> None:
    assert make_generator(SamplingParams(seed=3)) is None


def _draws(generator: torch.Generator | None, n: int = 64) -> list[int]:
    probs = torch.full((n, 10), 0.1)
    return sample(probs, generator).tolist()


def test_seeded_generator_reproduces() -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    first, second = make_generator(params), make_generator(params)
    assert isinstance(first, torch.Generator)
    assert _draws(first) == _draws(second)
    # ...and the streams keep agreeing, not just the first batch.
    assert _draws(first) == _draws(second)
    other = make_generator(SamplingParams(temperature=1.0, seed=1235))
    assert _draws(other) != _draws(make_generator(params))


def test_seeded_generator_ignores_global_rng() -> None:
    params = SamplingParams(temperature=0.7, seed=7)
    torch.manual_seed(0)
    a = _draws(make_generator(params))
    torch.manual_seed(999)
    torch.rand(100)
    b = _draws(make_generator(params))
    assert a == b


def test_unseeded_generators_differ_and_leave_global_rng_alone() -> None:
    torch.manual_seed(42)
    expected_global = torch.rand(4)
    torch.manual_seed(42)
    gens = [make_generator(SamplingParams(temperature=1.0)) for _ in range(2)]
    assert all(isinstance(g, torch.Generator) for g in gens)
    # 64 draws over 10 tokens colliding by chance has probability 1e-64.
    assert _draws(gens[0]) != _draws(gens[1])
    assert torch.equal(torch.rand(4), expected_global)


def test_sample_shape_dtype_and_support() -> None:
    gen = make_generator(SamplingParams(temperature=1.0, seed=0))
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 1.0], [0.2, 0.2, 0.2, 0.4]])
    tokens = sample(probs.repeat(200, 1), gen)
    assert tokens.shape == (600,) and tokens.dtype == torch.int64
    by_row = tokens.view(200, 3)
    assert set(by_row[:, 0].tolist()) == {1, 2}
    assert set(by_row[:, 1].tolist()) == {3}
    # A one-hot row needs no generator.
    assert sample(one_hot_probs([5, 1], 8), None).tolist() == [5, 1]


def test_sample_frequencies_match_probs() -> None:
    gen = make_generator(SamplingParams(temperature=1.0, seed=11))
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3])
    counts = torch.bincount(sample(probs.expand(20000, 4), gen), minlength=4).double() / 20000
    torch.testing.assert_close(counts, probs.double(), atol=0.015, rtol=0)
