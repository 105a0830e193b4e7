"""Lossless speculative sampling, checked statistically: drafting from ``q`` and running the accept
rule must emit tokens distributed exactly as the target ``p`` (chi-square, fixed seeds). The same
harness, fed deliberately biased rules, must reject them, so a passing result means the harness can
actually see a bias. The rules case by case: ``test_accept_rules.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch
from accept_stats import AcceptRule, V, _gen, chi_square_pvalue
from trispec.accept import AcceptResult, residual_distribution, speculative_accept
from trispec.sampling import SamplingParams, logits_to_probs, one_hot_probs, sample


@dataclass(frozen=True)
class TwoStepModel:
    """A toy context-dependent LM: ``first`` [V] for position 0, ``second[a]`` [V] after token a."""

    first: torch.Tensor
    second: torch.Tensor


@dataclass(frozen=True)
class Fit:
    p_first: float  # p-value: first emitted token ~ target.first
    p_second: float  # p-value: second emitted token ~ target.second[a], given draft a was accepted
    p_bonus: float  # p-value: bonus token ~ its row target.second[b], given both drafts were accepted
    accept_rate: float  # empirical acceptance of the first draft
    expected_accept_rate: float  # sum_x min(p(x), q(x)): what lossless speculative sampling achieves


def _pair_counts(pairs: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(pairs, dtype=torch.long), minlength=vocab * vocab).view(vocab, vocab)


def fit_to_target(rule: AcceptRule, target: TwoStepModel, draft: TwoStepModel, trials: int, seed: int) -> Fit:
    """Draft two tokens from ``draft`` per trial, run ``rule`` against ``target``, test the output.

    Identical code for the real rule and the deliberately biased ones. Draft draws are vectorised;
    the rule sees one sequence at a time, all trials sharing one generator as a request would.
    """
    draft_gen, accept_gen = _gen(seed), _gen(seed + 1)
    vocab = target.first.shape[0]
    x0 = torch.multinomial(draft.first, trials, replacement=True, generator=draft_gen)
    x1 = torch.multinomial(draft.second[x0], 1, generator=draft_gen).squeeze(1)
    # Rows per context, precomputed so a trial only indexes. The bonus row (after drafts a, b) is
    # second[b]: a toy choice, but a distinct row per context, so an off-by-one row is visible.
    q_rows = torch.stack([draft.first.expand(vocab, vocab), draft.second], dim=1)  # [a] -> [2, V]
    p_rows = torch.stack(
        [
            target.first.expand(vocab, vocab, vocab),
            target.second[:, None, :].expand(vocab, vocab, vocab),
            target.second[None, :, :].expand(vocab, vocab, vocab),
        ],
        dim=2,
    )  # [a, b] -> [3, V]

    first_tokens: list[int] = []
    second_pairs: list[int] = []  # a * vocab + second emitted token, for accepted first drafts a
    bonus_pairs: list[int] = []  # b * vocab + bonus token, when both drafts were accepted
    for a, b in zip(x0.tolist(), x1.tolist(), strict=True):
        result = rule([a, b], q_rows[a], p_rows[a, b], accept_gen)
        first_tokens.append(result.tokens[0])
        if result.num_accepted >= 1:
            second_pairs.append(a * vocab + result.tokens[1])
        if result.num_accepted == 2:
            bonus_pairs.append(b * vocab + result.tokens[2])
    first_counts = torch.bincount(torch.tensor(first_tokens), minlength=vocab)
    second_counts = _pair_counts(second_pairs, vocab)  # [accepted first draft, second emitted token]
    return Fit(
        p_first=chi_square_pvalue(first_counts, target.first),
        p_second=chi_square_pvalue(second_counts, target.second),
        p_bonus=chi_square_pvalue(_pair_counts(bonus_pairs, vocab), target.second),
        accept_rate=float(second_counts.sum()) / trials,
        expected_accept_rate=float(torch.minimum(target.first, draft.first).sum()),
    )


def _softmax_model(seed: int, scale: float = 1.5) -> TwoStepModel:
    gen = _gen(seed)
    return TwoStepModel(
        first=torch.softmax(scale * torch.randn(V, generator=gen), -1),
        second=torch.softmax(scale * torch.randn(V, V, generator=gen), -1),
    )


def _perturbed(model: TwoStepModel, seed: int, sigma: float = 0.4) -> TwoStepModel:
    """A draft close to ``model``: its log-probabilities plus Gaussian noise."""
    gen = _gen(seed)
    first = torch.softmax(model.first.log() + sigma * torch.randn(V, generator=gen), -1)
    second = torch.softmax(model.second.log() + sigma * torch.randn(V, V, generator=gen), -1)
    return TwoStepModel(first=first, second=second)


def _rolled(first: list[float]) -> TwoStepModel:
    # Context-dependent: after token a the same shape shifted by a.
    row = torch.tensor(first)
    return TwoStepModel(first=row, second=torch.stack([row.roll(a) for a in range(V)]))


def _logits(seed: int) -> torch.Tensor:
    """Random logits for a two-step model: row 0 for position 0, row 1 + a after token a."""
    return torch.randn(1 + V, V, generator=_gen(seed))


def _through(logits: torch.Tensor, params: SamplingParams) -> TwoStepModel:
    """The model a request with ``params`` samples from: every row through ``logits_to_probs``."""
    probs = logits_to_probs(logits, params)
    return TwoStepModel(first=probs[0], second=probs[1:])


FILTERED = SamplingParams(temperature=0.9, top_k=4, top_p=0.9)


HOT_NUCLEUS = SamplingParams(temperature=1.5, top_p=0.8)


PAIRS: dict[str, tuple[TwoStepModel, TwoStepModel]] = {
    "close": (_softmax_model(10), _perturbed(_softmax_model(10), seed=11)),
    # q puts its mass where p has little; each has a token the other never produces.
    "far": (_rolled([0.0, 0.05, 0.1, 0.15, 0.3, 0.4]), _rolled([0.35, 0.3, 0.2, 0.1, 0.05, 0.0])),
    # A deterministic drafter (n-gram style): one-hot q rows.
    "one_hot_draft": (
        _softmax_model(12),
        TwoStepModel(
            first=one_hot_probs([2], V)[0], second=one_hot_probs([(a + 1) % V for a in range(V)], V)
        ),
    ),
    # p and q both through logits_to_probs with the same temperature / top-k / top-p; the draft's
    # logits are correlated with the target's.
    "filtered_logits": (_through(_logits(20), FILTERED), _through(0.5 * _logits(20) + _logits(21), FILTERED)),
    # Same transform, unrelated logits: q far from p and the nucleus supports barely overlap.
    "nucleus_unrelated_logits": (
        _through(1.5 * _logits(30), HOT_NUCLEUS),
        _through(1.5 * _logits(31), HOT_NUCLEUS),
    ),
}


TRIALS = 20_000


@pytest.mark.parametrize("pair", list(PAIRS))
def test_speculative_sampling_matches_target(pair: str) -> None:
    target, draft = PAIRS[pair]
    fit = fit_to_target(speculative_accept, target, draft, TRIALS, seed=100)
    assert fit.p_first > 1e-3, fit
    assert fit.p_second > 1e-3, fit
    assert fit.p_bonus > 1e-3, fit
    # Lossless is not enough (always rejecting would be lossless): the acceptance rate must be the
    # optimal sum_x min(p, q), within 5 binomial standard deviations.
    rate = fit.expected_accept_rate
    assert abs(fit.accept_rate - rate) <= 5 * (rate * (1 - rate) / TRIALS) ** 0.5 + 1e-9, fit


def test_pairs_exercise_what_they_claim() -> None:
    # Guard against vacuous pairs: the first positions really differ, both positions have choices,
    # supports differ, and the filters really cut (top-k caps at 4, top-p cuts some rows below it).
    for target, draft in PAIRS.values():
        assert (target.first > 0).sum() >= 2
        assert not torch.equal(target.first, draft.first)
        assert 0.0 < torch.minimum(target.first, draft.first).sum() < 0.95
    for pair in ("far", "filtered_logits", "nucleus_unrelated_logits"):
        target, draft = PAIRS[pair]
        assert ((target.second > 0) != (draft.second > 0)).any()
    for model in PAIRS["filtered_logits"]:
        kept = torch.cat([(model.first > 0).sum(-1, keepdim=True), (model.second > 0).sum(-1)])
        assert kept.max() == 4 and kept.min() < 4


def always_accept(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
) -> AcceptResult:
    k = len(draft_tokens)
    return AcceptResult(k, [*draft_tokens, int(sample(target_probs[k : k + 1], gen)[0])])


def _accept_then_correct(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
    accept_prob: Callable[[float, float], float],
    correction: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> AcceptResult:
    """The speculative loop with a pluggable acceptance probability and rejection distribution."""
    for i, x in enumerate(draft_tokens):
        p_x, q_x = float(target_probs[i, x]), float(draft_probs[i, x])
        if float(torch.rand((), generator=gen)) >= accept_prob(p_x, q_x):
            dist = correction(target_probs[i], draft_probs[i])
            return AcceptResult(i, [*draft_tokens[:i], int(sample(dist[None], gen)[0])])
    k = len(draft_tokens)
    return AcceptResult(k, [*draft_tokens, int(sample(target_probs[k : k + 1], gen)[0])])


def bonus_from_last_draft_row(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
) -> AcceptResult:
    # Off by one: the bonus token drawn from p_{k-1} instead of p_k.
    result = speculative_accept(draft_tokens, draft_probs, target_probs, gen)
    k = len(draft_tokens)
    if result.num_accepted < k:
        return result
    return AcceptResult(k, [*draft_tokens, int(sample(target_probs[k - 1 : k], gen)[0])])


def inverted_ratio(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
) -> AcceptResult:
    # min(1, q/p) instead of min(1, p/q).
    def accept_prob(p: float, q: float) -> float:
        return min(1.0, q / p) if p > 0 else 1.0

    return _accept_then_correct(
        draft_tokens, draft_probs, target_probs, gen, accept_prob, residual_distribution
    )


def _textbook_accept_prob(p: float, q: float) -> float:
    return min(1.0, p / q) if q > 0 else 0.0


def resample_from_p(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
) -> AcceptResult:
    # Right acceptance test, but the correction ignores q (p instead of the residual).
    return _accept_then_correct(
        draft_tokens, draft_probs, target_probs, gen, _textbook_accept_prob, lambda p, q: p
    )


def textbook_rule(
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator | None,
) -> AcceptResult:
    # The correct rule through the same pluggable loop: the biased variants differ from it only in
    # the part that is wrong, so their failures are due to that part.
    return _accept_then_correct(
        draft_tokens, draft_probs, target_probs, gen, _textbook_accept_prob, residual_distribution
    )


# Fewer trials than TRIALS keeps the file fast; fewer trials only make a bias harder to detect, so
# catching it here means the harness at TRIALS would catch it too.
BIASED_TRIALS = 4_000


@pytest.mark.parametrize(
    "rule",
    [always_accept, inverted_ratio, resample_from_p, bonus_from_last_draft_row],
    ids=lambda r: r.__name__,
)
@pytest.mark.parametrize("pair", ["far", "filtered_logits"])
def test_harness_rejects_biased_rules(rule: AcceptRule, pair: str) -> None:
    target, draft = PAIRS[pair]
    fit = fit_to_target(rule, target, draft, BIASED_TRIALS, seed=100)
    assert min(fit.p_first, fit.p_second, fit.p_bonus) < 1e-6, fit


def test_harness_accepts_textbook_rule() -> None:
    # Control for the test above: same loop, correct parts, same trials -> no false alarm.
    target, draft = PAIRS["filtered_logits"]
    fit = fit_to_target(textbook_rule, target, draft, BIASED_TRIALS, seed=100)
    assert min(fit.p_first, fit.p_second, fit.p_bonus) > 1e-3, fit
