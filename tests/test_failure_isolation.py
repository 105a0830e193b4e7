"""A target failure on one sequence fails that request only; the batch carries on unchanged. A
drafter failure fails nothing: that step decodes plain, and repeated failure turns drafting off."""

from __future__ import annotations

import pytest
from tiny import FaultyEngine, model_drafter, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.torch_engine import TorchEngine
from trispec.request import GenerationRequest
from trispec.runners.torch_runner import MAX_DRAFT_FAILURES_IN_A_ROW
from trispec.sequence import FinishReason

PROMPTS = [
    "alpha beta",
    "gamma delta epsilon",
    "a much longer prompt that needs chunked prefill " * 3,
    "zeta",
]


def _run(poisoned: set[int], where: str, k: int) -> tuple[dict, TorchEngine, TorchEngine, FaultyEngine]:
    target, draft_engine = tiny_engine(0), tiny_engine(1)
    faulty_target = FaultyEngine(target, poisoned if where == "target" else set())
    faulty_draft = FaultyEngine(draft_engine, poisoned if where == "drafter" else set())
    llm = spec_engine(
        faulty_target,  # type: ignore[arg-type]
        ModelDrafter(faulty_draft),  # type: ignore[arg-type]
        max_prefill_tokens_per_step=24,
        adaptive_speculation=False,
    )
    ids = [llm.add_request(GenerationRequest(prompt=p, max_tokens=24, num_draft_tokens=k)) for p in PROMPTS]
    assert ids == list(range(len(PROMPTS)))
    faulty = faulty_target if where == "target" else faulty_draft
    return run_to_completion(llm), target, draft_engine, faulty


@pytest.mark.parametrize("where", ["target"])
@pytest.mark.parametrize("poisoned_id", [0, 2])  # 2 has the long, chunk-prefilled prompt
def test_one_failing_sequence_fails_alone(where: str, poisoned_id: int) -> None:
    reference, _, _, _ = _run(set(), where, k=3)
    outputs, target, draft_engine, faulty = _run({poisoned_id}, where, k=3)

    assert faulty.failures >= 1
    failed = outputs[poisoned_id][-1]
    assert failed.finished and failed.finish_reason is FinishReason.ERROR
    assert failed.error is not None and "simulated device fault" in failed.error
    for rid in range(len(PROMPTS)):
        if rid == poisoned_id:
            continue
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH
        assert tokens_of(outputs[rid]) == tokens_of(reference[rid]), f"request {rid} changed"
    # nothing leaked: both pools are empty again
    assert target.kv_usage().used_blocks == 0
    assert draft_engine.kv_usage().used_blocks == 0


def test_requests_after_a_failure_are_served() -> None:
    target = tiny_engine(0)
    faulty = FaultyEngine(target, {0})
    llm = spec_engine(faulty, model_drafter(1))  # type: ignore[arg-type]
    llm.add_request(GenerationRequest(prompt="doomed", max_tokens=8))
    first = run_to_completion(llm)
    assert first[0][-1].finish_reason is FinishReason.ERROR
    later = llm.add_request(GenerationRequest(prompt="fine", max_tokens=8))
    second = run_to_completion(llm)
    assert second[later][-1].finish_reason is FinishReason.LENGTH
    assert len(tokens_of(second[later])) == 8
    assert target.kv_usage().used_blocks == 0


@pytest.mark.parametrize("poisoned_id", [0, 2])
def test_a_draft_engine_failing_again_and_again_turns_drafting_off(poisoned_id: int) -> None:
    """Every request's output stays exactly the reference; the drafter is called no more."""
    reference, _, _, _ = _run(set(), "drafter", k=3)
    outputs, target, draft_engine, faulty = _run({poisoned_id}, "drafter", k=3)
    assert faulty.failures >= MAX_DRAFT_FAILURES_IN_A_ROW
    for rid in range(len(PROMPTS)):
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH
        assert tokens_of(outputs[rid]) == tokens_of(reference[rid]), f"request {rid} changed"
    assert target.kv_usage().used_blocks == 0
    assert draft_engine.kv_usage().used_blocks == 0


class FlakyDrafter:
    """A real model drafter whose ``propose`` raises on the calls listed (counting from 1)."""

    def __init__(self, drafter: ModelDrafter, fail_on: set[int]) -> None:
        self.drafter = drafter
        self.fail_on = fail_on
        self.calls = 0

    def propose(self, requests):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("simulated drafter fault")
        return self.drafter.propose(requests)

    def __getattr__(self, name: str) -> object:
        return getattr(self.drafter, name)


def test_a_drafter_failing_now_and_then_costs_one_plain_step_each_time() -> None:
    prompts = ["alpha beta", "gamma delta epsilon"]

    def run(fail_on: set[int]):  # type: ignore[no-untyped-def]
        drafter = FlakyDrafter(model_drafter(0), fail_on)
        llm = spec_engine(tiny_engine(0), drafter)  # type: ignore[arg-type]
        requests = [GenerationRequest(prompt=p, max_tokens=20, num_draft_tokens=3) for p in prompts]
        ids = [llm.add_request(r) for r in requests]
        outputs = run_to_completion(llm)
        return [tokens_of(outputs[i]) for i in ids], llm

    reference, _ = run(set())
    tokens, llm = run({2, 4, 5})  # never three in a row
    assert tokens == reference
    assert llm.stats.draft_failures == 3
    assert not llm.runner.drafting_off  # type: ignore[attr-defined]
    assert llm.stats.accepted_tokens > 0  # it went on drafting after each failure
