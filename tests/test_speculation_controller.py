"""The adaptive speculation controller, with hand-made timings."""

from __future__ import annotations

from tiny import model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.request import GenerationRequest
from trispec.speculation import SpeculationController, batch_bucket


def drive(controller: SpeculationController, batch: int, rates: dict[bool, float], steps: int) -> list[bool]:
    choices = []
    for _ in range(steps):
        arm = controller.choose(batch)
        choices.append(arm)
        controller.record(batch, arm, tokens=int(rates[arm] * 10), seconds=10.0)
    return choices


def test_buckets() -> None:
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 7, 8, 31, 32)] == [0, 1, 1, 2, 2, 3, 4, 5]


def test_picks_the_faster_arm_per_batch_size_and_keeps_exploring() -> None:
    controller = SpeculationController(warmup_steps=3, explore_every=10)
    # small batches: speculation is faster; large batches: plain is faster
    small = drive(controller, 1, {True: 30.0, False: 20.0}, 100)
    large = drive(controller, 16, {True: 40.0, False: 90.0}, 100)
    assert small[:3] == [True] * 3 and large[:3] == [True] * 3  # warm-up tries speculation first
    assert small[3:6] == [False] * 3 and large[3:6] == [False] * 3
    assert sum(small[6:]) > 80
    # speculation lost by more than 1.5x at batch 16: it is re-tried only every 4 x 10 steps
    assert 1 <= sum(large[6:]) <= 3
    assert not all(small[6:]) and any(large[6:])  # the other arm is still tried now and then
    snapshot = controller.snapshot()
    assert snapshot[1]["speculative"] > snapshot[1]["plain"]
    assert snapshot[16]["plain"] > snapshot[16]["speculative"]


def test_follows_a_change() -> None:
    controller = SpeculationController(warmup_steps=2, explore_every=5, smoothing=0.5)
    drive(controller, 4, {True: 50.0, False: 20.0}, 40)
    later = drive(controller, 4, {True: 10.0, False: 20.0}, 60)
    assert sum(later[-20:]) <= 5


class Alternating(SpeculationController):
    """Forces a plain step every other step: exactness must not depend on the choice."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def choose(self, batch_size: int) -> bool:
        self.n += 1
        return self.n % 2 == 0


class AlwaysPlain(SpeculationController):
    def choose(self, batch_size: int) -> bool:
        return False


PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [1, 2, 3]]


def run(controller: SpeculationController | None, **request: object) -> list[list]:
    llm = spec_engine(tiny_engine(0), model_drafter(0, dtype="bfloat16"), adaptive_speculation=False)
    llm.scheduler.controller = controller
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=30, num_draft_tokens=4, **request))  # type: ignore[arg-type]
        for p in PROMPTS
    ]
    outputs = run_to_completion(llm)
    return [outputs[i] for i in ids]


def test_switching_arms_mid_request_keeps_the_output() -> None:
    switched = run(Alternating())
    assert [tokens_of(o) for o in switched] == [tokens_of(o) for o in run(None)]
    for outputs in switched:
        stats = outputs[-1].stats
        # both arms really ran: rounds with drafts and plain rounds
        assert 0 < stats.drafts < stats.rounds


def test_plain_choice_makes_plain_steps_except_for_seeded_requests() -> None:
    plain = run(AlwaysPlain())
    assert [tokens_of(o) for o in plain] == [tokens_of(o) for o in run(None)]
    for outputs in plain:
        stats = outputs[-1].stats
        assert stats.draft_tokens == 0 and stats.rounds == 30  # one token per plain round
    # a seeded sampled request drafts its own k whatever the controller says (its draws depend on k)
    seeded = run(AlwaysPlain(), temperature=0.8, seed=5)
    assert all(outputs[-1].stats.draft_tokens > 0 for outputs in seeded)
    assert [tokens_of(o) for o in seeded] == [tokens_of(o) for o in run(None, temperature=0.8, seed=5)]
