"""The coupled rule on the device, as the CUDA-graph path runs it: the fixed-width kept set keeps the
definition's tokens on every row it does not flag (adversarial rows, random mixed batches), and the
graph sampler picks ``coupled_tokens``' tokens and ``log_probs_of``' log-probabilities on the same
logits, with the C kernel and with the Triton kernel (interpreted)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from required_builds import triton
from test_kept_set import TOP_KS, TOP_PS, adversarial_rows
from trispec.logits_rules import log_probs_of
from trispec.sampling import KeptSet, coupled_tokens, full_sort_kept_mask, logits_to_probs
from trispec.sampling.device_kept_set import device_kept_sets
from trispec.sampling.graph_sampler import SamplerMode, SamplingRows, choose_tokens
from trispec.sampling_params import SamplingParams


def kept_on_device(x: torch.Tensor, top_k: list[int], top_p: list[float], width: int = 256):
    threshold, ties, unfit = device_kept_sets(
        x, torch.tensor(top_k), torch.tensor(top_p, dtype=torch.float64), width
    )
    return KeptSet(threshold, ties).mask(x), unfit


@pytest.mark.parametrize("width", [256, 8])
def test_the_device_kept_set_is_the_definitions_where_it_fits(width: int) -> None:
    flagged = 0
    for name, row in adversarial_rows().items():
        row = row.unsqueeze(0)
        vocab = row.shape[-1]
        for top_k in [*TOP_KS, vocab - 1, vocab, vocab + 5]:
            for top_p in TOP_PS:
                mask, unfit = kept_on_device(row, [top_k], [top_p], width)
                flagged += int(unfit)
                if not unfit:
                    assert torch.equal(mask, full_sort_kept_mask(row, top_k, top_p)), (name, top_k, top_p)
                # only a top-k past the width, a nucleus past it, or a mass at top_p's margin is flagged
                wide = 0 < top_k < vocab and top_k > width + 1
                assert not unfit or wide or top_p < 1.0, (name, top_k, top_p)
    assert flagged < (400 if width == 8 else 100)


def test_the_device_kept_set_over_random_batches_with_mixed_settings() -> None:
    rng = random.Random(0)
    fitted = 0
    for trial in range(60):
        vocab = rng.choice([2, 9, 64, 300, 5000])
        n = rng.randrange(1, 12)
        x = torch.randn(n, vocab, generator=torch.Generator().manual_seed(trial)) * rng.choice(
            [0.05, 1, 4, 30]
        )
        if trial % 3 == 0:
            x = x.round()
        top_k = [rng.choice([*TOP_KS, vocab, vocab + 1, 300]) for _ in range(n)]
        top_p = [rng.choice(TOP_PS) for _ in range(n)]
        mask, unfit = kept_on_device(x, top_k, top_p, 64)
        for i in range(n):
            if not unfit[i]:
                fitted += 1
                assert torch.equal(mask[i], full_sort_kept_mask(x[i : i + 1], top_k[i], top_p[i])[0]), (
                    trial,
                    i,
                )
    assert fitted > 200


def staged_rows(params: list[SamplingParams], positions: list[int]) -> SamplingRows:
    rows = SamplingRows.allocate(len(params), torch.device("cpu"))
    rows.stage(list(zip(params, positions)), 1)
    return rows


PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, seed=3),
    SamplingParams(temperature=1.3, top_k=5, seed=2**64 - 1),
    SamplingParams(temperature=0.5, top_p=0.9, seed=11, return_log_probs=True),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.8, seed=2**63 + 7),
    SamplingParams(return_log_probs=True),
    SamplingParams(temperature=0.8, top_p=0.95, seed=5),
]


@pytest.mark.parametrize("kernel", ["c", "triton"])
@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_the_graph_sampler_picks_the_eager_rules_tokens_and_log_probs(kernel: str) -> None:
    if kernel == "triton":
        triton()  # a failure where the test extra installs it, else a skip (required_builds.py)
    vocab = 300 if kernel == "c" else 96  # the interpreter is slow
    n = len(PARAMS)
    mode = SamplerMode(noise=True, kept=True, log_probs=True)
    for trial in range(6 if kernel == "c" else 1):
        logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(trial)) * 4
        logits[trial % n, ::7] = -math.inf
        positions = [trial * 10 + i for i in range(n)]
        tokens, log_probs = choose_tokens(
            logits, logits.argmax(-1), staged_rows(PARAMS, positions), mode, flag_unfit=True, kernel=kernel
        )
        assert tokens.tolist() == coupled_tokens(logits, PARAMS, positions)
        assert log_probs is not None
        for i, sp in enumerate(PARAMS):
            probs = None if sp.greedy else logits_to_probs(logits[i : i + 1], sp)
            expected = log_probs_of(logits[i : i + 1], sp, [int(tokens[i])], probs)
            assert float(log_probs[i]) == expected[0], i


def test_a_verify_row_whose_nucleus_does_not_fit_is_flagged_and_a_draft_falls_back() -> None:
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(0)) * 0.01  # nearly flat
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=1), SamplingParams(temperature=0.7, seed=2)]
    rows = staged_rows(params, [0, 0])
    mode = SamplerMode(noise=True, kept=True)
    flagged, _ = choose_tokens(logits, logits.argmax(-1), rows, mode, flag_unfit=True, kernel="c")
    assert flagged[0] == -1 and flagged[1] == coupled_tokens(logits, params, [0, 0])[1]
    drafted, _ = choose_tokens(logits, logits.argmax(-1), rows, mode, flag_unfit=False, kernel="c")
    assert drafted[0] == logits[0].argmax() and drafted[1] == flagged[1]
