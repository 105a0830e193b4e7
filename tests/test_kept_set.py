"""What top-k / top-p keep: the sort-free finder (``find_kept_sets``) keeps exactly the tokens of the
full-sort definition (``full_sort_kept_mask``) on adversarial rows and random batches with mixed
settings; and the rejection rule's distributions and seeded draws are the ones the previous full-sort
sampler gave (its code is kept here as the reference)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from trispec.sampling import find_kept_sets, full_sort_kept_mask, kept_set, logits_to_probs, sample
from trispec.sampling_params import SamplingParams

TOP_KS = [0, 1, 2, 3, 7, 40]
TOP_PS = [1.0, 0.999999, 0.95, 0.9, 0.5, 0.3, 0.2, 1e-6]


def adversarial_rows(vocab: int = 50) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(vocab)
    flat = torch.zeros(vocab)
    peak = torch.full((vocab,), -5.0)
    peak[vocab // 3] = 10.0
    boundary_ties = torch.cat([torch.tensor([3.0, 2.0]), torch.full((vocab - 2,), 1.0)])
    steps = torch.arange(vocab).float().div(10).floor().neg()  # runs of 10 equal values
    with_neg_inf = torch.randn(vocab, generator=g)
    with_neg_inf[::2] = -math.inf
    only_one_finite = torch.full((vocab,), -math.inf)
    only_one_finite[7] = 0.0
    exact_quarters = torch.log(torch.tensor([0.25, 0.25, 0.25, 0.25] + [1e-30] * (vocab - 4)))
    rounded = (torch.randn(vocab, generator=g) * 2).round()
    return {
        "flat": flat,
        "one peak": peak,
        "long ties at the boundary": boundary_ties,
        "steps of ties": steps,
        "-inf entries": with_neg_inf,
        "one finite value": only_one_finite,
        "exact quarters": exact_quarters,
        "rounded": rounded,
        "huge range": torch.randn(vocab, generator=g) * 1000,
    }


@pytest.mark.parametrize("finder", ["c kernel", "torch.topk (CUDA, no C kernel)"])
@pytest.mark.parametrize("name", list(adversarial_rows()))
def test_the_kept_set_is_the_full_sorts_on_adversarial_rows(
    name: str, finder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if finder != "c kernel":
        monkeypatch.setattr(kept_set, "_kernel", None)
    row = adversarial_rows()[name].unsqueeze(0)
    vocab = row.shape[-1]
    for top_k in [*TOP_KS, vocab - 1, vocab, vocab + 5]:
        for top_p in TOP_PS:
            kept = find_kept_sets(row, [top_k], [top_p])
            expected = full_sort_kept_mask(row, top_k, top_p)
            assert torch.equal(kept.mask(row), expected), (name, top_k, top_p)
            assert expected.sum() >= 1


@pytest.mark.parametrize("finder", ["c kernel", "torch.topk (CUDA, no C kernel)"])
def test_the_kept_set_is_the_full_sorts_over_random_batches_with_mixed_settings(
    finder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if finder != "c kernel":
        monkeypatch.setattr(kept_set, "_kernel", None)
    rng = random.Random(0)
    for trial in range(40):
        vocab = rng.choice([2, 9, 64, 300, 5000])
        n = rng.randrange(1, 12)
        g = torch.Generator().manual_seed(trial)
        scale = rng.choice([0.05, 1.0, 4.0, 30.0])
        x = torch.randn(n, vocab, generator=g) * scale
        if trial % 3 == 0:
            x = x.round()  # ties everywhere
        top_k = [rng.choice([*TOP_KS, vocab, vocab + 1]) for _ in range(n)]
        top_p = [rng.choice(TOP_PS) for _ in range(n)]
        mask = find_kept_sets(x, top_k, top_p).mask(x)
        for i in range(n):
            assert torch.equal(mask[i], full_sort_kept_mask(x[i : i + 1], top_k[i], top_p[i])[0]), (trial, i)


def test_a_wide_nucleus_grows_past_the_first_candidates() -> None:
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(1)) * 0.01  # nearly flat
    kept = find_kept_sets(x, [0] * 3, [0.9] * 3)
    assert torch.equal(kept.mask(x), torch.cat([full_sort_kept_mask(x[i : i + 1], 0, 0.9) for i in range(3)]))
    assert int(kept.mask(x).sum(-1).min()) > 10000


# -- the previous sampler (full sort per row), as it was: the reference for "unchanged by the rewrite"
def _previous_filter_sorted(sorted_logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    vocab_size = sorted_logits.shape[-1]
    if 0 < top_k < vocab_size:
        sorted_logits = sorted_logits.clone()
        sorted_logits[..., top_k:] = -math.inf
    if top_p < 1.0:
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        mass_before[..., 0] = 0.0
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, -math.inf)
    return sorted_logits


def _previous_logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scaled = logits.float() / params.temperature
    if params.top_k == 0 and params.top_p >= 1.0:
        return torch.softmax(scaled, dim=-1)
    sorted_logits, sorted_ids = torch.sort(scaled, dim=-1, descending=True, stable=True)
    sorted_probs = torch.softmax(_previous_filter_sorted(sorted_logits, params.top_k, params.top_p), dim=-1)
    return torch.empty_like(sorted_probs).scatter_(-1, sorted_ids, sorted_probs)


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40},
        {"temperature": 1.0, "top_p": 0.95},
        {"temperature": 0.5, "top_k": 5},
        {"temperature": 1.3},
    ],
)
def test_the_rejection_rules_draws_are_unchanged_by_the_rewrite(settings: dict) -> None:
    params = SamplingParams(seed=1, **settings)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 3000, generator=g) * 4
    new, old = logits_to_probs(logits, params), _previous_logits_to_probs(logits, params)
    assert torch.equal(new > 0, old > 0)  # the same kept sets
    torch.testing.assert_close(new, old, rtol=1e-5, atol=1e-7)
    for seed in range(50):
        draw_new = sample(new, torch.Generator().manual_seed(seed))
        draw_old = sample(old, torch.Generator().manual_seed(seed))
        assert torch.equal(draw_new, draw_old)


def test_the_kernels_candidates_are_torch_topks_values() -> None:
    from trispec.sampling.kept_set import top_candidates

    g = torch.Generator().manual_seed(5)
    for vocab, m in [(1, 1), (16, 16), (17, 3), (300, 40), (5000, 64), (5000, 1024), (49152, 256)]:
        x = torch.randn(5, vocab, generator=g) * 3
        x[1] = x[1].round()  # ties
        x[2, ::2] = -math.inf
        values, ids = top_candidates(x, m)
        assert torch.equal(values, torch.topk(x, m).values), (vocab, m)
        assert torch.equal(x.gather(-1, ids), values)
        assert all(len(set(row)) == m for row in ids.tolist())
