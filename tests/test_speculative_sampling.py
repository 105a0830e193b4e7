"""Sampling at T > 0 through the whole loop follows the target's law: a different model drafts, the
runner verifies from the target's logits, and the emitted tokens are distributed exactly as the
target samples them, under either sampling rule.

``test_accept.py`` checks the pure accept rules with hand-made tokens and probabilities; this checks
what users get: the draft model's own proposals (its KV cache, its keyed noise or its q), the
runner's batching and the scheduler's seeds, end to end. The first two emitted tokens of many
unseeded requests (each is given a fresh seed) are compared with the target's exact joint law
p(x1) p(x2 | x1), and x1 with p(x1), by chi-square tests. The expected law is computed from the
target's logits with the kept set's full-sort definition (sampling/kept_set.py), not with the
sampler under test. Mutated rules must fail the same harness: a pass means it can see a bias:
noise keyed without the position, the p/q test with the draft's keyed noise (vLLM's bug: the test's
uniform and the residual resample must not reuse the draft's noise), accepting every draft.
With penalties on, the target's law is the penalised one (logits_rules.py), applied by the verifier
to the target's logits and by the draft model to its own at the same positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from tiny import run_to_completion, spec_engine, tiny_args, tokens_of
from trispec import accept, verifier
from trispec.accept import AcceptResult
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.logits_rules import apply_rules
from trispec.request import GenerationRequest
from trispec.runners import torch_runner
from trispec.sampling import coupled, full_sort_kept_mask, logits_to_probs
from trispec.sampling.noise import gumbel, gumbel_of, noise_bits
from trispec.sampling_params import SamplingParams

V = 8  # a vocabulary small enough to test the joint of two tokens cell by cell
PROMPT = [1, 5, 2, 7]
N = 4000
HOT = {"temperature": 1.0}
NUCLEUS = {"temperature": 0.7, "top_p": 0.9}
# strong enough to move the joint far from the plain target's (checked below)
PENALTIES = {"temperature": 1.3, "repetition_penalty": 1.8, "presence_penalty": 0.8, "frequency_penalty": 0.5}
# under the null hypothesis a p-value this low has odds 1e-5; the mutated rules score below 1e-9
PASS, FAIL = 1e-5, 1e-9
# a mutated rule runs on fewer requests: it fails even so (p below 1e-45 at 750-1000 requests,
# 2026-11-28), and a harness that sees a bias on fewer requests sees it on N
MUTANT_N = 1000


def engine(seed: int) -> TorchEngine:
    return TorchEngine.from_random(tiny_args(vocab_size=V), seed, num_blocks=2000, block_size=8)


def target_joint(settings: dict[str, float]) -> np.ndarray:
    """p(x1, x2) = p(x1 | prompt) p(x2 | prompt, x1) from the target's logits alone: the request's
    rules, temperature, and the kept set's full-sort definition, renormalised."""
    target = engine(0)
    params = SamplingParams(**settings)
    target.add_sequence(0, len(PROMPT) + 2)

    def probs(logits: torch.Tensor, context: list[int]) -> torch.Tensor:
        scaled = apply_rules(logits, params, context).double() / params.temperature
        kept = full_sort_kept_mask(scaled.float(), params.top_k, params.top_p)[0]
        return torch.softmax(scaled[0].masked_fill(~kept, -torch.inf), dim=-1)

    first = probs(target.forward([ForwardInput(0, PROMPT, 1)])[0], PROMPT)
    joint = np.zeros((V, V))
    for x1 in range(V):
        target.truncate(0, len(PROMPT))
        second = probs(target.forward([ForwardInput(0, [x1], 1)])[0], [*PROMPT, x1])
        joint[x1] = (first[x1] * second).numpy()
    return joint / joint.sum()


def sampled_pairs(
    k: int, settings: dict[str, float], rule: str = "coupled", n: int = N
) -> tuple[np.ndarray, float]:
    """Counts of the first two emitted tokens (x1, x2) over ``n`` unseeded requests, and the
    acceptance rate."""
    llm = spec_engine(engine(0), ModelDrafter(engine(9)), max_batch_size=N, sampling_rule=rule)
    ids = [
        llm.add_request(
            GenerationRequest(
                prompt_token_ids=PROMPT, max_tokens=max(k + 1, 2), num_draft_tokens=k, **settings
            )
        )
        for _ in range(n)
    ]
    outputs = run_to_completion(llm)
    counts = np.zeros((V, V))
    for rid in ids:
        x1, x2 = tokens_of(outputs[rid])[:2]
        counts[x1, x2] += 1
    assert (llm.stats.draft_tokens > 0) == (k > 0)
    return counts, llm.stats.acceptance_rate


def p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    exp = expected.ravel() * counts.sum()
    obs = counts.ravel()
    if obs[exp == 0].any():  # a token the law rules out
        return 0.0
    obs, exp = obs[exp > 0], exp[exp > 0]
    # cells with tiny expected counts make chi-square unreliable: pool them into one cell
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    return float(chisquare(obs, exp).pvalue)


def law_p_value(counts: np.ndarray, expected: np.ndarray) -> float:
    """The smaller of the joint's and the first token's p-values."""
    return min(p_value(counts, expected), p_value(counts.sum(axis=1), expected.sum(axis=1)))


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    return {"hot": target_joint(HOT), "nucleus": target_joint(NUCLEUS), "penalised": target_joint(PENALTIES)}


def test_target_laws_are_spread(expected: dict[str, np.ndarray]) -> None:
    # a near-deterministic target would make every test below pass for any rule
    assert (expected["hot"] > 0.01).sum() >= 12
    assert (expected["nucleus"] > 0.01).sum() >= 6
    # the nucleus really cut tokens off: some cells are impossible
    assert (expected["nucleus"] == 0).sum() >= 8


@pytest.mark.parametrize("k", [0, 4])
@pytest.mark.parametrize("name", ["hot", "nucleus"])
def test_emitted_tokens_follow_the_target(name: str, k: int, expected: dict[str, np.ndarray]) -> None:
    counts, acceptance = sampled_pairs(k, HOT if name == "hot" else NUCLEUS)
    if k:
        # the draft model disagrees with the target often: rejections were exercised
        assert 0.2 < acceptance < 0.95
    assert law_p_value(counts, expected[name]) > PASS


def test_the_rejection_rule_follows_the_target_too(expected: dict[str, np.ndarray]) -> None:
    counts, acceptance = sampled_pairs(4, HOT, rule="rejection")
    assert 0.2 < acceptance < 0.95
    assert law_p_value(counts, expected["hot"]) > PASS


def test_noise_keyed_without_the_position_is_caught(monkeypatch: pytest.MonkeyPatch, expected: dict) -> None:
    real = coupled.perturbed_argmax
    monkeypatch.setattr(
        coupled,
        "perturbed_argmax",
        lambda scaled, kept, seeds, positions: real(scaled, kept, seeds, [0] * len(seeds)),
    )
    assert law_p_value(sampled_pairs(4, HOT, n=MUTANT_N)[0], expected["hot"]) < FAIL


def _shared_noise_pq_round(decodes, drafts, logits, generators, masks=None):  # type: ignore[no-untyped-def]
    """The p/q test on drafts drawn with the keyed noise, its uniform and its residual resample taken
    from that same noise: what vLLM once shipped. q is recomputed from the draft model's logits."""
    results = []
    for s, d, rows in zip(decodes, drafts, logits, strict=True):
        p = logits_to_probs(rows, s.sampling)
        q = d.probs
        first = len(s.token_ids) - s.sampling.prompt_len
        tokens: list[int] = []
        for i, x in enumerate(d.tokens):
            bits = noise_bits(s.sampling.seed, first + i, torch.arange(V))
            if float((bits[x] + 0.5) / 2**32) * float(q[i, x]) < float(p[i, x]):
                tokens.append(x)
                continue
            residual = (p[i] - q[i]).clamp(min=0)
            score = torch.log(residual).double() + gumbel_of(bits)
            results.append(verifier.Verified(AcceptResult(i, [*tokens, int(score.argmax())])))
            break
        else:
            k = len(d.tokens)
            score = torch.log(p[k]).double() + gumbel(s.sampling.seed, first + k, torch.arange(V))
            results.append(verifier.Verified(AcceptResult(k, [*tokens, int(score.argmax())])))
    return results


def test_the_pq_test_with_the_drafts_noise_is_caught(monkeypatch: pytest.MonkeyPatch, expected: dict) -> None:
    draw = ModelDrafter._draw

    def draw_keeping_q(requests, drafted, logits, probs):  # type: ignore[no-untyped-def]
        for n, r in enumerate(requests):  # the drafts are still the coupled rule's; q rides along
            probs[n].append(logits_to_probs(logits[n : n + 1], r.sampling)[0])
        return draw(requests, drafted, logits, probs)

    monkeypatch.setattr(ModelDrafter, "_draw", staticmethod(draw_keeping_q))
    monkeypatch.setattr(torch_runner, "verify_round", _shared_noise_pq_round)
    counts, acceptance = sampled_pairs(4, HOT, n=MUTANT_N * 3 // 4)  # its Python verify is slow
    assert 0.2 < acceptance < 0.95
    assert law_p_value(counts, expected["hot"]) < FAIL


def test_accepting_every_draft_is_caught(monkeypatch: pytest.MonkeyPatch, expected: dict) -> None:
    """Emitting the draft model's own samples must be rejected by the harness."""
    monkeypatch.setattr(
        verifier,
        "accept_matching",
        lambda drafts, targets: accept.accept_matching(drafts, [*drafts, targets[-1]]),
    )
    assert law_p_value(sampled_pairs(4, HOT, n=MUTANT_N)[0], expected["hot"]) < FAIL


@pytest.mark.parametrize("rule", ["coupled", "rejection"])
def test_with_penalties_emitted_tokens_follow_the_penalised_target(rule: str, expected: dict) -> None:
    counts, acceptance = sampled_pairs(3, PENALTIES, rule)
    assert 0.2 < acceptance < 0.95
    assert law_p_value(counts, expected["penalised"]) > PASS
    # the penalties really changed the law: the plain target's is rejected
    plain = target_joint({"temperature": PENALTIES["temperature"]})
    assert law_p_value(counts, plain) < FAIL


def test_a_verifier_that_skips_the_penalties_is_caught(
    monkeypatch: pytest.MonkeyPatch, expected: dict
) -> None:
    monkeypatch.setattr(verifier, "apply_rules", lambda logits, *args: logits)
    assert law_p_value(sampled_pairs(3, PENALTIES, n=MUTANT_N)[0], expected["penalised"]) < FAIL
