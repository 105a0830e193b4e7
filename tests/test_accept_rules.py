"""Accept/reject rules case by case: greedy matching (all accepted plus the bonus token, the first
rejection, ties, shapes) and the rejection rule's single decisions (certain accepts and rejects,
the residual distribution, one-hot drafts, a seeded generator that leaves the global RNG alone).
Their distribution as a whole: ``test_accept.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from accept_stats import V, _gen, chi_square_pvalue
from trispec.accept import AcceptResult, argmax_rows, greedy_accept, residual_distribution, speculative_accept
from trispec.sampling import SamplingParams, make_generator, one_hot_probs, sample


def _rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


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


def test_argmax_rows_is_torch_argmax_ties_masks_strides_and_nan_included() -> None:
    """The numpy path for CPU float32 rows gives torch.argmax's index in every case it meets."""
    gen = torch.Generator().manual_seed(3)
    cases = [torch.randn(1, 151936, generator=gen), torch.randn(9, 49152, generator=gen)]
    cases.append(torch.randint(0, 3, (16, 64), generator=gen).float())  # many ties: the lowest id wins
    masked = torch.randn(4, 100, generator=gen)
    masked[:, ::2] = -math.inf  # a grammar's or a rule's mask
    cases += [masked, torch.randn(10, 50, generator=gen)[::3], torch.randn(6, 40, generator=gen).T]
    cases.append(torch.tensor([[1.0, math.nan, 5.0], [math.nan, math.nan, 1.0], [-math.inf] * 3]))
    for logits in cases:
        assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    wide = torch.randn(3, 8, generator=gen).double()  # not float32: torch's own argmax
    assert argmax_rows(wide) == wide.argmax(dim=-1).tolist()
