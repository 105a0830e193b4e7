"""Adaptive k through the real scheduler on the tiny models: whatever the controller chooses (drafting
and plain steps alternating mid-request, plain forced, the real controller), the output stays the
target's; with plain steps forced nothing drafts except seeded requests under the rejection rule.
The choice itself: ``test_controller_choice.py``, ``test_controller_online.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiny import model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.request import GenerationRequest
from trispec.speculation import GoodputController


# -- through the scheduler: the choice never changes the output ----------------------------------------
class Alternating(GoodputController):
    """Plain every other step: exactness must not depend on the choice."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def choose(self, seq_ids: Sequence[int], max_ks: Sequence[int], **_: object) -> list[int]:
        self.n += 1
        return list(max_ks) if self.n % 2 else [0] * len(max_ks)


class AlwaysPlain(GoodputController):
    def choose(self, seq_ids: Sequence[int], max_ks: Sequence[int], **_: object) -> list[int]:
        return [0] * len(max_ks)


PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [1, 2, 3]]


def run(
    controller: GoodputController | None, sampling_rule: str = "coupled", **request: object
) -> list[list]:
    llm = spec_engine(
        tiny_engine(0),
        model_drafter(0, dtype="bfloat16"),
        adaptive_speculation=False,
        sampling_rule=sampling_rule,
    )
    llm.scheduler.controller = controller
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=30, num_draft_tokens=4, **request))  # type: ignore[arg-type]
        for p in PROMPTS
    ]
    outputs = run_to_completion(llm)
    return [outputs[i] for i in ids]


def test_switching_between_drafting_and_plain_mid_request_keeps_the_output() -> None:
    switched = run(Alternating())
    assert [tokens_of(o) for o in switched] == [tokens_of(o) for o in run(None)]
    for outputs in switched:
        stats = outputs[-1].stats
        assert 0 < stats.drafts < stats.rounds  # both kinds of step really ran


def test_plain_choice_makes_plain_steps_except_for_seeded_requests_under_the_rejection_rule() -> None:
    plain = run(AlwaysPlain())
    assert [tokens_of(o) for o in plain] == [tokens_of(o) for o in run(None)]
    for outputs in plain:
        stats = outputs[-1].stats
        assert stats.draft_tokens == 0 and stats.rounds == 30  # one token per plain round
    # the coupled rule: a seeded sampled request's output does not depend on k, so the controller's
    # choice holds for it too, and the text is the same
    seeded = run(AlwaysPlain(), temperature=0.8, seed=5)
    assert all(outputs[-1].stats.draft_tokens == 0 for outputs in seeded)
    assert [tokens_of(o) for o in seeded] == [tokens_of(o) for o in run(None, temperature=0.8, seed=5)]
    # the rejection rule: it drafts its own k whatever the controller says (its draws depend on k)
    by_rejection = run(AlwaysPlain(), "rejection", temperature=0.8, seed=5)
    assert all(outputs[-1].stats.draft_tokens > 0 for outputs in by_rejection)
    expected = run(None, "rejection", temperature=0.8, seed=5)
    assert [tokens_of(o) for o in by_rejection] == [tokens_of(o) for o in expected]


def test_the_real_controller_keeps_the_output() -> None:
    adaptive = run(GoodputController(warmup_steps=2, explore_every=3))
    assert [tokens_of(o) for o in adaptive] == [tokens_of(o) for o in run(None)]
