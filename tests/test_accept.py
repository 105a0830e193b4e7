"""Accept/reject rules: greedy matching and lossless speculative sampling.

The core check is statistical: drafting from ``q`` and running the accept rule must emit tokens
distributed exactly as the target ``p`` (chi-square, fixed seeds). The same harness, fed deliberately
biased rules, must reject them, so a passing result means the harness can actually see a bias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.stats import chi2, chisquare
from trispec.accept import AcceptResult, greedy_accept, residual_distribution, speculative_accept
from trispec.sampling import SamplingParams, logits_to_probs, make_generator, one_hot_probs, sample

V = 6

AcceptRule = Callable[[Sequence[int], torch.Tensor, torch.Tensor, "torch.Generator | None"], AcceptResult]


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- greedy_accept ------------------------------------------------------------------------------


def _logits_with_argmax(argmaxes: list[int], vocab: int = V) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), vocab, generator=_gen(0))
    logits[torch.arange(len(argmaxes)), argmaxes] = 10.0
    return logits


def test_greedy_all_accepted_plus_bonus() -> None:
    result = greedy_accept([3, 1, 4], _logits_with_argmax([3, 1, 4, 5]))
    assert result == AcceptResult(num_accepted=3, tokens=[3, 1, 4, 5])


def test_greedy_first_rejected() -> None:
    result = greedy_accept([3, 1, 4], _logits_with_argmax([2, 1, 4, 5]))
    assert result == AcceptResult(num_accepted=0, tokens=[2])


def test_greedy_middle_rejected() -> None:
    # Draft 2 would match row 2, but nothing after the first mismatch counts.
    result = greedy_accept([3, 1, 4], _logits_with_argmax([3, 0, 4, 5]))
    assert result == AcceptResult(num_accepted=1, tokens=[3, 0])


def test_greedy_k0_is_plain_decoding() -> None:
    result = greedy_accept([], _logits_with_argmax([4]))
    assert result == AcceptResult(num_accepted=0, tokens=[4])


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = _rows([0.0, 2.0, 2.0, 1.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    assert greedy_accept([2], logits) == AcceptResult(num_accepted=0, tokens=[1])
    assert greedy_accept([1], logits) == AcceptResult(num_accepted=1, tokens=[1, 0])


def test_greedy_accepts_tensor_drafts() -> None:
    result = greedy_accept(torch.tensor([3, 1]), _logits_with_argmax([3, 2, 0]))
    assert result == AcceptResult(num_accepted=1, tokens=[3, 2])
    assert all(type(t) is int for t in result.tokens)


def test_greedy_rejects_wrong_shapes() -> None:
    with pytest.raises(ValueError):
        greedy_accept([1, 2], torch.zeros(2, V))  # needs k+1 rows
    with pytest.raises(ValueError):
        greedy_accept([V], torch.zeros(2, V))  # token outside the vocab


# --- speculative_accept: hand-made cases ---------------------------------------------------------


def test_certain_accept_when_p_at_least_q() -> None:
    q = _rows([0.1, 0.2, 0.3, 0.4, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    # p[x] >= q[x] on the drafted tokens (3 and 0) and the bonus row is one-hot on 5.
    p = _rows([0.0, 0.1, 0.1, 0.4, 0.2, 0.2], [0.9, 0.1, 0.0, 0.0, 0.0, 0.0], [0, 0, 0, 0, 0, 1])
    for seed in range(300):
        assert speculative_accept([3, 0], q, p, _gen(seed)) == AcceptResult(2, [3, 0, 5])


def test_identical_p_and_q_always_accept() -> None:
    # p == q: every ratio is 1, so drafting costs nothing (and the residual is never needed).
    p = torch.softmax(torch.randn(4, V, generator=_gen(4)), -1)
    for seed in range(100):
        drafts = sample(p[:3], _gen(1000 + seed)).tolist()
        assert speculative_accept(drafts, p[:3].clone(), p, _gen(seed)).num_accepted == 3


def test_certain_reject_when_p_of_draft_is_zero() -> None:
    q = _rows([0.2, 0.2, 0.2, 0.2, 0.2, 0.0], [0.1, 0.6, 0.1, 0.1, 0.1, 0.0])
    # Draft 0 (token 4) is certainly accepted, draft 1 (token 1) has p = 0: certainly rejected,
    # and the correction comes from norm(max(0, p - q)) = tokens {3, 5} only.
    p = _rows([0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.1, 0.0, 0.1, 0.3, 0.0, 0.5], [1, 0, 0, 0, 0, 0])
    corrections = set()
    for seed in range(300):
        result = speculative_accept([4, 1], q, p, _gen(seed))
        assert result.num_accepted == 1
        assert result.tokens[0] == 4
        assert len(result.tokens) == 2
        corrections.add(result.tokens[1])
    assert corrections == {3, 5}


def test_draft_with_zero_q_is_rejected() -> None:
    # q says token 2 was impossible, so it was not drawn from q: reject even though p likes it.
    q = _rows([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    p = _rows([0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [1, 0, 0, 0, 0, 0])
    for seed in range(50):
        result = speculative_accept([2], q, p, _gen(seed))
        assert result == AcceptResult(0, [2])  # rejected, then the residual (all on token 2) emits it


def test_residual_distribution_values() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.6, 0.1, 0.1])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))


def test_residual_degenerate_falls_back_to_p() -> None:
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    assert torch.equal(residual_distribution(p, p.clone()), p)
    # p == q and a draft q calls impossible: rejected, residual is all zero, so the token comes from p.
    q2 = _rows([0.5, 0.5, 0.0, 0.0])
    p2 = _rows([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0])
    seen = {speculative_accept([3], q2, p2, _gen(seed)).tokens[0] for seed in range(100)}
    assert seen == {0, 1}


def test_rejection_samples_the_residual() -> None:
    # Token 3 has p = 0 so it is always rejected; corrections must follow [0.75, 0, 0.25, 0].
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.6, 0.1, 0.1]])
    gen = _gen(5)
    counts = torch.zeros(4)
    for _ in range(3000):
        result = speculative_accept([3], q, p, gen)
        assert result.num_accepted == 0
        counts[result.tokens[0]] += 1
    assert chi_square_pvalue(counts, torch.tensor([0.75, 0.0, 0.25, 0.0])) > 1e-3
    # Sampling p instead of the residual (a classic bug) would give token 1 30% of the time.
    assert counts[1] == 0


def test_k0_samples_from_p() -> None:
    p = _rows([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    assert speculative_accept([], torch.zeros(0, V), p, _gen(0)) == AcceptResult(0, [2])


def test_one_hot_drafter_accepts_with_probability_p() -> None:
    # A deterministic drafter (q one-hot) is accepted with probability p[x] = 0.3.
    q = one_hot_probs([1], V)
    p = _rows([0.2, 0.3, 0.5, 0.0, 0.0, 0.0], [1, 0, 0, 0, 0, 0])
    gen = _gen(9)
    accepted = sum(speculative_accept([1], q, p, gen).num_accepted for _ in range(2000))
    assert abs(accepted / 2000 - 0.3) < 5 * (0.3 * 0.7 / 2000) ** 0.5


def test_speculative_rejects_wrong_shapes() -> None:
    with pytest.raises(ValueError):
        speculative_accept([1, 2], torch.zeros(2, V), torch.zeros(2, V), None)  # p needs k+1 rows
    with pytest.raises(ValueError):
        speculative_accept([1, 2], torch.zeros(1, V), torch.zeros(3, V), None)  # q needs k rows
    with pytest.raises(ValueError):
        speculative_accept([1], torch.zeros(1, V + 1), torch.zeros(2, V), None)  # vocab mismatch


def test_seeded_generator_reproduces_and_global_rng_is_untouched() -> None:
    q = torch.softmax(torch.randn(3, V, generator=_gen(1)), -1)
    p = torch.softmax(torch.randn(4, V, generator=_gen(2)), -1)
    drafts = sample(q, _gen(3)).tolist()
    params = SamplingParams(temperature=1.0, seed=77)

    def run() -> list[AcceptResult]:
        gen = make_generator(params)
        return [speculative_accept(drafts, q, p, gen) for _ in range(200)]

    torch.manual_seed(0)
    first = run()
    global_after = torch.rand(3)
    torch.manual_seed(0)
    second = run()
    assert first == second
    # Every draw came from the request's generator, none from torch's global RNG.
    assert torch.equal(torch.rand(3), global_after)
    assert torch.equal(global_after, torch.rand(3, generator=_gen(0)))
    # ...and the outcome does depend on the seed.
    gen = make_generator(SamplingParams(temperature=1.0, seed=78))
    assert [speculative_accept(drafts, q, p, gen) for _ in range(200)] != first


# --- exactness harness ---------------------------------------------------------------------------


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``counts`` to ``probs``; 2-D inputs are independent rows (contexts).

    Each row is tested against its own total (a conditional distribution), and the row statistics
    are summed with their degrees of freedom. A count where the probability is 0 is impossible
    under the target: p-value 0. Cells expecting fewer than 5 are pooled within their row so the
    chi-square approximation holds.
    """
    counts_rows = counts.double().reshape(-1, counts.shape[-1]).numpy()
    probs_rows = probs.double().reshape(-1, probs.shape[-1]).numpy()
    statistic, dof = 0.0, 0
    for obs, prob in zip(counts_rows, probs_rows, strict=True):
        if obs[prob <= 0].sum() > 0:
            return 0.0
        obs, prob = obs[prob > 0], prob[prob > 0]
        expected = prob / prob.sum() * obs.sum()
        small = expected < 5
        if small.any():
            obs = np.append(obs[~small], obs[small].sum())
            expected = np.append(expected[~small], expected[small].sum())
        if len(obs) >= 2:  # one bin (or an empty row) carries no information
            statistic += float(chisquare(obs, expected).statistic)
            dof += len(obs) - 1
    return float(chi2.sf(statistic, dof)) if dof else 1.0


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


# --- (target, draft) pairs -----------------------------------------------------------------------


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


# --- biased rules: the same harness must catch them ----------------------------------------------


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
