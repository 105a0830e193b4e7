"""Adaptive k, online: the goodput controller's cost model and acceptance rates learned from step
timings and rounds as they come, and its exploration (a few rotating sequences draft while plain
wins, backing off, skipped where catching up would cost too much, new requests from the global
rate, a request kept plain by one bad round tried again).
"""

from __future__ import annotations

import pytest
from controller_tables import CHEAP, drive
from trispec.speculation import GoodputController, StepCost, choose_ks, expected_tokens


def test_the_cost_model_is_learned_from_step_timings() -> None:
    controller = GoodputController()
    drive(controller, CHEAP, accept=0.8, batch=4, steps=40)
    assert controller.cost is not None
    assert controller.cost.target_base_s == pytest.approx(CHEAP.target_base_s, rel=0.05)
    assert controller.cost.target_row_s == pytest.approx(CHEAP.target_row_s, rel=0.2)
    assert controller.acceptance(0)[0] == pytest.approx(0.8, abs=0.1)


def test_it_drafts_when_it_pays_and_stops_when_it_does_not() -> None:
    pays = drive(GoodputController(), CHEAP, accept=0.85, batch=2, steps=100)
    assert sum(k > 0 for k in pays[20:]) >= 75
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    loses = drive(GoodputController(explore_every=32), never, accept=0.85, batch=8, steps=200)
    assert sum(k > 0 for k in loses[20:]) <= 180 // 32 + 1  # only the exploration steps draft


def test_no_exploration_where_drafting_could_not_come_near_paying() -> None:
    # ``never``: even accepting everything, drafting loses by far more than 10 %: nothing to learn
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(warmup_steps=2, explore_every=8, max_explore_every=8)
    chosen = drive(controller, never, accept=0.85, batch=8, steps=200)
    assert not any(chosen[20:]) and controller._explorations == 0
    # drafting a little worse than plain at 85 % acceptance, but within reach at 90 %: explore
    near = StepCost(target_base_s=0.030, target_row_s=0.0005, draft_pass_s=0.022, draft_seq_s=0.0)
    controller = GoodputController(warmup_steps=2, explore_every=8, max_explore_every=8)
    drive(controller, near, accept=0.5, batch=2, steps=200)
    assert controller._explorations >= 150 // 8


# the mechanics of exploring, wherever it happens (``explore_margin=1.0``: whatever the model says)
def test_exploration_drafts_for_a_few_rotating_sequences_only() -> None:
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(warmup_steps=2, explore_every=8, max_explore_every=8, explore_margin=1.0)
    drive(controller, never, accept=0.85, batch=16, steps=40)  # warm: the model says plain
    drafted_steps = []
    for _ in range(64):
        ks = controller.choose(list(range(16)), [4] * 16)
        if any(ks):
            drafted_steps.append([i for i, k in enumerate(ks) if k])
            assert set(ks) == {0, 2}  # two draft positions, not the cap of four
    assert len(drafted_steps) == 64 // 8
    assert sorted({len(s) for s in drafted_steps}) == [1, 2]  # never the whole batch
    assert len({i for s in drafted_steps for i in s}) >= 8  # rotating over the batch


def test_exploration_backs_off_while_plain_wins_and_resets_when_drafting_pays() -> None:
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(
        warmup_steps=2, explore_every=16, max_explore_every=1024, explore_margin=1.0
    )
    drive(controller, never, accept=0.85, batch=4, steps=2000)
    # intervals 16, 32, 64, ... 1024: about a dozen explorations in 2000 steps, not 2000 / 16
    assert 5 <= controller._explorations <= 12
    assert controller._explore_interval == 1024
    # a heavier target pass (the same draft): drafting pays now, and the model sees it from the
    # verify timings alone; exploring goes back to the base rate at once
    heavy = StepCost(target_base_s=0.5, target_row_s=0.0005, draft_pass_s=0.030, draft_seq_s=0.005)
    chosen = drive(controller, heavy, accept=0.95, batch=4, steps=150)
    # at the cap: no request's rates stay stuck where the cheap regime's few rounds left them
    assert sum(k == 4 for k in chosen[-50:]) >= 45
    assert controller._explore_interval == 16


def test_exploration_is_skipped_when_catching_up_would_cost_too_much() -> None:
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(warmup_steps=2, explore_every=8, max_explore_every=8, explore_margin=1.0)
    drive(controller, never, accept=0.85, batch=4, steps=40)
    controller.record_step([4, 0, 0, 0], 0.14 + 0.5, None, catch_up_tokens=500)  # 1 ms a token
    controller.record_step([4, 0, 0, 0], 0.14 + 0.05, None, catch_up_tokens=50)
    controller.cost = controller._fit()
    assert controller.cost.catch_up_token_s == pytest.approx(0.001, rel=0.1)
    # 8 steps of ~0.07 s until the next exploration: 1 % of that is 5.6 ms, i.e. ~5 tokens to catch up
    explored = [
        any(controller.choose(list(range(4)), [4] * 4, lags=[400] * 4, remaining=[64] * 4)) for _ in range(32)
    ]
    assert not any(explored)
    explored = [
        any(controller.choose(list(range(4)), [4] * 4, lags=[2] * 4, remaining=[64] * 4)) for _ in range(32)
    ]
    assert sum(explored) == 32 // 8


def test_exploration_picks_the_sequences_whose_draft_cache_lags_least() -> None:
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(warmup_steps=2, explore_every=4, max_explore_every=4, explore_margin=1.0)
    drive(controller, never, accept=0.85, batch=6, steps=40)
    lags = [400, 300, 0, 200, 0, 500]
    explored = []
    for _ in range(16):
        ks = controller.choose(list(range(6)), [4] * 6, lags=lags, remaining=[64] * 6)
        explored += [i for i, k in enumerate(ks) if k]
    assert explored and set(explored) <= {2, 4}


def test_no_exploration_whose_catch_up_costs_more_than_a_quarter_step() -> None:
    # a long prompt's catch-up would cost a short run several percent at once: explore without it,
    # or not at all (here the catch-up cost is not measured yet: a target row's cost stands in)
    never = StepCost(target_base_s=0.030, target_row_s=0.010, draft_pass_s=0.030, draft_seq_s=0.005)
    controller = GoodputController(
        warmup_steps=2, explore_every=4, max_explore_every=4, explore_budget=1.0, explore_margin=1.0
    )
    drive(controller, never, accept=0.85, batch=6, steps=40)
    step_s = never.target_base_s + never.target_row_s * 6  # a quarter of one plain step: <= 2 tokens
    for lags, allowed in (([400, 300, 3, 500, 40, 600], set()), ([400, 300, 2, 200, 40, 500], {2})):
        explored = []
        for _ in range(16):
            ks = controller.choose(list(range(6)), [4] * 6, lags=lags, remaining=[64] * 6)
            explored += [i for i, k in enumerate(ks) if k]
        assert set(explored) == allowed, (lags, step_s)


def test_a_new_request_starts_from_the_global_rate() -> None:
    controller = GoodputController(prior_strength=3.0)
    for _ in range(50):
        controller.record_round(1, 4, 4)  # request 1 accepts everything
    assert controller.acceptance(1)[0] > 0.9
    assert controller.acceptance(2)[0] > 0.9  # a new request inherits the global rate
    for _ in range(50):
        controller.record_round(2, 4, 0)  # ... until its own rounds say otherwise
    assert controller.acceptance(2)[0] < 0.1
    controller.forget(2)
    assert 2 not in controller._requests


def test_a_request_kept_plain_by_one_bad_round_is_tried_again() -> None:
    # every other request accepts everything: drafting pays at this cost table
    cost = StepCost(target_base_s=0.05, target_row_s=0.004, draft_pass_s=0.005, target_knee=8)
    controller = GoodputController(prior_strength=3.0)
    for seq_id in range(1, 8):
        for _ in range(20):
            controller.record_round(seq_id, 2, 2)
    controller.record_round(8, 2, 0)  # request 8's first round: both drafts rejected
    gain = [expected_tokens(controller.acceptance(8), k) - 1 for k in range(3)]
    assert gain[1] < 0.75  # one round pulled its estimate well below the others'

    def k_of_8() -> int:
        accepts = [controller.acceptance(i) for i in range(1, 9)]
        return choose_ks(accepts, [2] * 8, cost)[-1]

    assert k_of_8() < 2
    rounds = 0
    while k_of_8() < 2 and rounds < 20:  # plain rounds carry no evidence: its estimate fades back
        controller.record_round(8, 0, 0)
        rounds += 1
    assert rounds <= 8
    # ... but a long record of rejections keeps a request plain for more than a few rounds
    for _ in range(30):
        controller.record_round(9, 2, 0)
    for _ in range(8):
        controller.record_round(9, 0, 0)
    assert controller.acceptance(9)[0] < 0.5
