"""Sampling at T > 0 through the whole loop is lossless: a different model drafts, the runner verifies
from the target's logits, and the emitted tokens are distributed exactly as the target samples them.

``test_accept.py`` checks the pure accept rule with hand-made probabilities; this checks what users
get: the draft model's own q (its sampling transform, its KV cache), the runner's batching and the
seeded generators, end to end. The first two emitted tokens of many seeded requests are compared
with the target's exact joint distribution p(x1) p(x2 | x1) by a chi-square test; the same harness
with a biased accept rule must fail, so a pass means the harness can see a bias. With penalties on,
the target's distribution is the penalised one (logits_rules.py), applied by the verifier to p and by
the draft model to its q at the same positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from tiny import run_to_completion, spec_engine, tiny_args, tokens_of
from trispec import verifier
from trispec.accept import AcceptResult
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.logits_rules import apply_rules
from trispec.request import GenerationRequest
from trispec.sampling import logits_to_probs
from trispec.sampling_params import SamplingParams

V = 8  # a vocabulary small enough to test the joint of two tokens cell by cell
PROMPT = [1, 5, 2, 7]
SAMPLING = {"temperature": 1.3, "top_k": 0, "top_p": 1.0}
N = 4000
# strong enough to move the joint far from the plain target's (checked below)
PENALTIES = {"repetition_penalty": 1.8, "presence_penalty": 0.8, "frequency_penalty": 0.5}


def engine(seed: int) -> TorchEngine:
    return TorchEngine.from_random(tiny_args(vocab_size=V), seed, num_blocks=2000, block_size=8)


def target_joint(rules: dict[str, float] | None = None) -> np.ndarray:
    """p(x1, x2) = p(x1 | prompt) p(x2 | prompt, x1) from the target alone (``rules``: penalties,
    applied to each position's logits given the tokens before it)."""
    target = engine(0)
    params = SamplingParams(**SAMPLING, **(rules or {}))
    target.add_sequence(0, len(PROMPT) + 2)

    def probs(logits: torch.Tensor, context: list[int]) -> torch.Tensor:
        return logits_to_probs(apply_rules(logits, params, context), params)[0]

    first = probs(target.forward([ForwardInput(0, PROMPT, 1)])[0], PROMPT)
    joint = np.zeros((V, V))
    for x1 in range(V):
        target.truncate(0, len(PROMPT))
        second = probs(target.forward([ForwardInput(0, [x1], 1)])[0], [*PROMPT, x1])
        joint[x1] = (first[x1] * second).double().numpy()
    return joint / joint.sum()


def sampled_pairs(k: int, rules: dict[str, float] | None = None) -> tuple[np.ndarray, float]:
    """Counts of the first two emitted tokens (x1, x2) over N seeded requests, and the acceptance
    rate."""
    llm = spec_engine(engine(0), ModelDrafter(engine(9)), max_batch_size=N)
    ids = [
        llm.add_request(
            GenerationRequest(
                prompt_token_ids=PROMPT, max_tokens=4, num_draft_tokens=k, seed=i, **SAMPLING, **(rules or {})
            )
        )
        for i in range(N)
    ]
    outputs = run_to_completion(llm)
    counts = np.zeros((V, V))
    for rid in ids:
        # max_tokens 4 leaves room for 3 drafts in the first round (k is capped at max_tokens - 1)
        x1, x2 = tokens_of(outputs[rid])[:2]
        counts[x1, x2] += 1
    assert llm.stats.draft_tokens > 0
    return counts, llm.stats.acceptance_rate


def joint_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    # cells with tiny expected counts make chi-square unreliable: pool them into one cell
    exp = expected.ravel() * counts.sum()
    obs = counts.ravel()
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(chisquare(obs, exp).pvalue)


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    return target_joint()


def test_target_distribution_is_spread(expected: np.ndarray) -> None:
    # a near-deterministic target would make the test below pass for any rule
    assert (expected > 0.01).sum() >= 12


@pytest.mark.parametrize("k", [1, 3])
def test_emitted_tokens_follow_the_target(k: int, expected: np.ndarray) -> None:
    counts, acceptance = sampled_pairs(k)
    # the draft model disagrees with the target often: rejections (the residual path) were exercised
    assert 0.2 < acceptance < 0.95
    # fixed seeds: deterministic on one machine; under the null a p-value this low has odds 1e-4
    assert joint_p_value(counts, expected) > 1e-4


def test_a_biased_rule_is_caught(monkeypatch: pytest.MonkeyPatch, expected: np.ndarray) -> None:
    """Accepting every draft (emitting the draft model's samples) must be rejected by the harness."""

    def accept_all(draft_tokens, draft_probs, target_probs, generator) -> AcceptResult:  # type: ignore[no-untyped-def]
        last = int(torch.multinomial(target_probs[len(draft_tokens)], 1, generator=generator))
        return AcceptResult(len(draft_tokens), [*map(int, draft_tokens), last])

    monkeypatch.setattr(verifier, "speculative_accept", accept_all)
    assert joint_p_value(sampled_pairs(3)[0], expected) < 1e-6


@pytest.fixture(scope="module")
def expected_penalised() -> np.ndarray:
    return target_joint(PENALTIES)


@pytest.mark.parametrize("k", [1, 3])
def test_with_penalties_emitted_tokens_follow_the_penalised_target(
    k: int, expected: np.ndarray, expected_penalised: np.ndarray
) -> None:
    counts, acceptance = sampled_pairs(k, PENALTIES)
    assert 0.2 < acceptance < 0.95
    assert joint_p_value(counts, expected_penalised) > 1e-4
    # the penalties really changed the distribution: the plain target's joint is rejected
    assert joint_p_value(counts, expected) < 1e-6


def test_a_verifier_that_skips_the_penalties_is_caught(
    monkeypatch: pytest.MonkeyPatch, expected_penalised: np.ndarray
) -> None:
    monkeypatch.setattr(verifier, "apply_rules", lambda logits, *args: logits)
    assert joint_p_value(sampled_pairs(3, PENALTIES)[0], expected_penalised) < 1e-6
