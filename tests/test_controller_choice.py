"""Adaptive k, the pure choice: the goodput controller's k on hand-made acceptance and cost tables
(cheap drafts and high acceptance draft the most, drafting that never pays is k = 0, a verify pass
that turns compute-bound stops drafting past the knee, catching a draft cache up weighs on starting
to draft, a step is judged at the batch it is about to be).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from controller_tables import CHEAP, drive
from trispec.speculation import GoodputController, StepCost, choose_ks, draft_passes, expected_tokens


# -- the pure choice --------------------------------------------------------------------------------
def test_expected_tokens() -> None:
    assert expected_tokens([0.5], 0) == 1.0
    assert expected_tokens([0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([1.0, 0.5, 0.0], 4) == pytest.approx(1 + 1 + 0.5 + 0 + 0)
    assert expected_tokens([], 4) == 1.0


def test_cheap_draft_and_high_acceptance_draft_the_most() -> None:
    assert choose_ks([[0.9]], [8], CHEAP) == [8]
    assert choose_ks([[0.9]] * 4, [4] * 4, CHEAP) == [4] * 4


def test_when_drafting_never_pays_k_is_zero_everywhere() -> None:
    # a draft pass as slow as a target pass, and rows that cost a lot (compute-bound verify)
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    rng = random.Random(0)
    for batch in (1, 2, 8, 32):
        accepts = [[rng.uniform(0.0, 0.95)] for _ in range(batch)]
        assert choose_ks(accepts, [8] * batch, never) == [0] * batch
    assert choose_ks([[0.0]] * 3, [4] * 3, CHEAP) == [0, 0, 0]  # nothing is ever accepted


def test_a_thin_promised_gain_stays_plain() -> None:
    # one draft position that costs 48 % of a target pass: worth (1 + a) / 1.48 of plain
    cost = StepCost(target_base_s=0.030, target_row_s=0.0, draft_pass_s=0.0144)
    assert choose_ks([[0.52]], [1], cost) == [1]  # promises 2.7 % more
    assert choose_ks([[0.52]], [1], cost, min_gain=0.03) == [0]  # not the 3 % asked for
    assert choose_ks([[0.55]], [1], cost, min_gain=0.03) == [1]  # 4.7 %
    assert GoodputController().min_gain == 0.03


def test_k_is_per_request() -> None:
    # the same step: the copying request drafts, the one whose drafts are always rejected does not
    ks = choose_ks([[0.95], [0.05], [0.9]], [6, 6, 6], CHEAP)
    assert ks[1] == 0 and ks[0] > 0 and ks[2] > 0
    assert choose_ks([[0.95], [0.05]], [2, 6], CHEAP) == [2, 0]  # never above the request's own k


def test_compute_bound_batches_draft_less() -> None:
    # on a CPU the verify pass grows with rows: at 1 sequence drafting pays, at 32 it does not
    cpu = StepCost(target_base_s=0.020, target_row_s=0.002, draft_pass_s=0.004, draft_seq_s=0.0015)
    assert choose_ks([[0.8]], [4], cpu)[0] > 0
    assert choose_ks([[0.8]] * 32, [4] * 32, cpu) == [0] * 32


def test_shared_draft_passes_are_not_a_trap() -> None:
    # one sequence alone would not pay for a draft pass; all of them together do
    shared = StepCost(target_base_s=0.030, target_row_s=0.0001, draft_pass_s=0.012, draft_seq_s=0.0)
    assert choose_ks([[0.2]], [2], shared) == [0]
    assert all(k > 0 for k in choose_ks([[0.8]] * 16, [4] * 16, shared))


def test_draft_passes_count_the_sequences_drafting_each_position() -> None:
    assert draft_passes([4, 0, 2, 1]) == [3, 2, 1, 1]
    assert draft_passes([0, 0]) == [] and draft_passes([]) == []
    cost = StepCost(
        target_base_s=0.02, target_row_s=0.001, draft_pass_s=0.01, draft_seq_s=0.002, draft_knee=2
    )
    # passes of 3, 2, 1, 1 sequences: only the first is past the knee of 2
    assert cost.seconds([4, 0, 2, 1]) == pytest.approx(0.02 + 0.001 * 11 + 4 * 0.01 + 0.002)


# a CPU's verify pass: flat (weights read once) up to 8 rows, then compute-bound at 1.5 ms a row
KNEED = StepCost(
    target_base_s=0.020,
    target_row_s=0.0015,
    draft_pass_s=0.004,
    draft_seq_s=0.0008,
    target_knee=8,
    draft_knee=2,
)


def test_a_verify_pass_that_turns_compute_bound_stops_drafting_past_the_knee() -> None:
    assert choose_ks([[0.8]], [4], KNEED) == [4]  # 5 rows: inside the flat part, drafting pays
    # past the knee every row costs: fewer drafts as the batch grows, none at 8 sequences
    assert choose_ks([[0.8]] * 2, [4] * 2, KNEED) == [3, 3]
    assert choose_ks([[0.8]] * 4, [4] * 4, KNEED) == [1] * 4
    assert choose_ks([[0.8]] * 8, [4] * 8, KNEED) == [0] * 8  # 40 rows cost 68 ms: it does not


def test_a_drafter_that_is_mostly_free_costs_its_expectation() -> None:
    # suffix decoding before a model: four steps in five the suffix index proposes (free), the fifth
    # the model drafts (100 ms); what a step of drafting costs on average is 20 ms, not 0
    controller = GoodputController(warmup_steps=0)
    for step in range(40):
        controller.record_step([4], 0.1 if step % 5 == 4 else 0.0, 0.03)
        controller.record_step([0], 0.0, 0.03)
    cost = controller._fit()
    assert cost is not None
    assert cost.seconds([4]) - cost.seconds([0]) == pytest.approx(0.02, rel=0.05)


def test_the_knee_is_learned_from_step_timings() -> None:
    controller = GoodputController(warmup_steps=2, explore_every=4, max_explore_every=4)
    for batch in (1, 2, 4, 8, 16):
        drive(controller, KNEED, accept=0.8, batch=batch, steps=60)
    cost = controller._fit()
    assert cost is not None
    for rows in (1, 4, 8, 12, 20, 40, 80):
        assert cost.target_seconds(rows) == pytest.approx(KNEED.target_seconds(rows), rel=0.05), rows
    for sequences in (1, 2, 4, 8):
        assert cost.draft_pass_seconds(sequences) == pytest.approx(
            KNEED.draft_pass_seconds(sequences), rel=0.1
        )


def test_a_draft_cache_to_catch_up_weighs_on_starting_to_draft() -> None:
    # the same requests; the second's draft cache lacks its whole prompt: catching up costs more
    # than its share of the round gains, so it stays plain while the first drafts
    assert choose_ks([[0.9], [0.9]], [4, 4], CHEAP, start_s=[0.0, 0.5]) == [4, 0]
    assert choose_ks([[0.9], [0.9]], [4, 4], CHEAP, start_s=[0.0, 0.0]) == [4, 4]


def test_catch_up_cost_is_learned_and_spread_over_what_is_left() -> None:
    controller = GoodputController(warmup_steps=2)
    drive(controller, CHEAP, accept=0.9, batch=2, steps=30)
    assert controller.cost is not None and controller.cost.catch_up_token_s == 0.0  # none seen yet
    for tokens in (200, 50, 120, 10):  # fed on top of 4 draft passes, at 2 ms a token
        modelled = CHEAP.draft_pass_s * 4 + CHEAP.draft_seq_s * 8
        controller.record_step([4, 4], modelled + 0.002 * tokens, None, catch_up_tokens=tokens)
    assert controller.cost.catch_up_token_s == pytest.approx(0.002, rel=0.05)
    fitted, true = controller.cost, CHEAP  # drafts at [4, 4] alone cannot split passes from positions
    assert fitted.draft_pass_s * 4 + fitted.draft_seq_s * 8 == pytest.approx(
        true.draft_pass_s * 4 + true.draft_seq_s * 8, rel=0.05
    )
    # a long way to go amortises catching up; two tokens left do not
    assert controller.choose([0, 1], [4, 4], lags=[2, 300], remaining=[500, 500])[1] > 0
    assert controller.choose([0, 1], [4, 4], lags=[2, 300], remaining=[500, 2]) == [4, 0]


def test_catch_up_cost_is_per_token_beside_a_drafter_that_is_often_free() -> None:
    # model + suffix decoding: half the drafting steps cost next to nothing (the suffix drafted), half
    # run the model's three passes; a catch-up step always runs the model, plus 2.7 ms a token, and
    # the draft pool's prefix cache left catch-ups of a few tokens only
    model_s, per_token_s = 0.066, 0.0027
    controller = GoodputController(warmup_steps=2)
    for step in range(16):
        controller.record_step([0], 0.0, 0.045)
        controller.record_step([3], 0.0001 if step % 2 else model_s, 0.045 + 3 * 0.004)
    for tokens in (1, 2, 1, 6, 4, 1):
        controller.record_step([3], model_s + per_token_s * tokens, None, catch_up_tokens=tokens)
    controller.cost = controller._fit()
    assert controller.cost is not None
    assert controller.cost.catch_up_token_s == pytest.approx(per_token_s, rel=0.05)  # not 11 ms
    # so a request accepting its first draft two times in three, with 40 tokens to catch up and 63 to
    # go, starts drafting (charged 11 ms a catch-up token, it stayed plain)
    for _ in range(8):
        for accepted in (1, 2, 0):
            controller.record_round(7, 3, accepted)
    assert controller.choose([7], [3], lags=[40], remaining=[63]) == [1]
    controller.cost = replace(controller.cost, catch_up_token_s=0.011)
    assert controller.choose([7], [3], lags=[40], remaining=[63]) == [0]
    # catch-ups of a single length cannot split a step's part from a token's: the line through the
    # origin (what they cost, all of it, per token) rather than a catch-up called free
    alone = GoodputController(warmup_steps=2)
    for _ in range(8):
        alone.record_step([3], model_s, 0.057)
        alone.record_step([3], model_s + per_token_s, None, catch_up_tokens=1)
    fitted = alone._fit()
    assert fitted is not None and fitted.catch_up_token_s == pytest.approx(per_token_s, rel=0.05)


def test_no_catch_up_started_just_before_the_batch_grows_past_paying() -> None:
    # drafting pays at one sequence and not at eight (KNEED); a lone sequence whose draft cache
    # lacks its prompt starts drafting, amortising the catch-up over its 500 tokens to go, unless
    # seven requests are about to join: then it would draft a round or two for the whole catch-up
    controller = GoodputController(warmup_steps=2, explore_every=10_000)
    for batch in (1, 8):
        drive(controller, KNEED, accept=0.9, batch=batch, steps=60)
    controller.cost = replace(KNEED, catch_up_token_s=0.001)  # the truth, catching up at 1 ms a token
    assert controller.choose([0], [4], lags=[200], remaining=[500]) == [4]
    assert controller.choose([0], [4], lags=[200], remaining=[500], joining=7) == [0]
    # its cache already in step, nothing to catch up on: it still stays plain while the others
    # prefill (its draft passes would delay them, and the batch of eight does not pay)
    assert controller.choose([0], [4], lags=[1], remaining=[500], joining=7) == [0]
    assert controller.choose([0], [4], lags=[1], remaining=[500], joining=0) == [4]


def test_a_step_is_judged_at_the_batch_it_is_about_to_be() -> None:
    # drafting pays at one or two sequences and not at eight (KNEED): a sequence decoding beside
    # prompts being prefilled drafts only if the batch those requests make with it would
    controller = GoodputController(warmup_steps=2, explore_every=10_000)
    for batch in (1, 2, 8):
        drive(controller, KNEED, accept=0.9, batch=batch, steps=60)
    controller.cost = KNEED
    assert choose_ks([controller.acceptance(0)], [4], KNEED, min_gain=0.03) == [4]  # the step alone
    assert controller.choose([0], [4], joining=1)[0] > 0  # two sequences: drafting pays
    assert controller.choose([0], [4], joining=7) == [0]  # eight: it does not
    assert controller.choose([0, 1], [4, 4], joining=6) == [0, 0]


# measured on a 2-core CPU (SmolLM2-135M, its int8 self-draft): a verify pass, a draft pass, and a
# draft cache catching up at about a millisecond a token (a second prefill of the prompt)
SMOL = StepCost(target_base_s=0.0233, target_row_s=0.00055, draft_pass_s=0.0111, catch_up_token_s=0.001)


def test_a_catch_up_starts_only_where_drafting_pays_with_every_newcomer_catching_up() -> None:
    # two sequences, one in step, one whose draft cache lacks a 300-token prompt, 64 tokens to go.
    # Judged alone, the newcomer's catch-up looks paid for by the draft passes the other already
    # runs; but the other leaves soon and whoever takes its place catches up too, and with every
    # request paying a catch-up drafting loses here: the newcomer stays plain
    controller = GoodputController(warmup_steps=2, explore_every=10_000)
    drive(controller, SMOL, accept=0.95, batch=2, steps=60)
    controller.cost = SMOL
    accepts = [controller.acceptance(i) for i in (0, 1)]
    share = SMOL.catch_up_token_s * 300 / (64 / expected_tokens(accepts[1], 4))
    assert choose_ks(accepts, [4, 4], SMOL, start_s=[0.0, share]) == [4, 4]  # one step's view
    assert controller.choose([0, 1], [4, 4], lags=[2, 300], remaining=[64, 64])[1] == 0
    # a long output amortises the catch-up even in the steady state
    assert controller.choose([0, 1], [4, 4], lags=[2, 300], remaining=[500, 500]) == [4, 4]
    # nobody to catch up: both draft
    assert controller.choose([0, 1], [4, 4], lags=[2, 2], remaining=[64, 64]) == [4, 4]


def test_drafting_that_measured_slower_than_plain_stops_at_that_batch_size() -> None:
    # the model believes drafting pays (CHEAP); the steps say otherwise at two sequences, where a
    # drafting step of 9 tokens takes 0.2 s against plain's 0.031 s for 2
    controller = GoodputController(warmup_steps=2, explore_every=10_000)
    drive(controller, CHEAP, accept=0.9, batch=1, steps=20)
    controller._fit = lambda: CHEAP  # type: ignore[method-assign]  # the model keeps its belief
    controller.cost = CHEAP
    stopped_at = None
    for step in range(100):
        ks = controller.choose([0, 1], [4, 4])
        if not any(ks):
            stopped_at = step
            break
        controller.record_step(ks, 0.1, 0.1, tokens=9)
    assert stopped_at == controller.realised.min_drafted
    assert controller.choose([0], [4]) == [4]  # one sequence: nothing measured against it
    # plain at two sequences for ``hold`` decisions, then drafting is tried again
    held = [any(controller.choose([0, 1], [4, 4])) for _ in range(controller.realised.hold + 5)]
    assert not any(held[: controller.realised.hold - 5]) and any(held[-5:])


def test_warm_up_and_exploration_steps_are_not_the_models_choice_to_check() -> None:
    controller = GoodputController(warmup_steps=100)
    for _ in range(100):  # warm-up: forced drafting steps that lose badly
        ks = controller.choose([0, 1], [4, 4])
        controller.record_step(ks, 0.5 if any(ks) else 0.0, 0.03, tokens=2 + sum(ks))
    assert all(controller.realised.allows(2, d) for d in range(1000))
