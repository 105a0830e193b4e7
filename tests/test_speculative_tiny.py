"""The draft-verify loop on tiny random models: greedy exactness, batching invariance, rollback of
both caches, chunked prefill, stats. Reference outputs come from a plain one-token-at-a-time greedy
loop on a fresh engine, independent of the llm."""

from __future__ import annotations

import pytest
from tiny import (
    model_drafter,
    reference_greedy,
    repeating_prompts,
    run_to_completion,
    spec_engine,
    tiny_engine,
    tokens_of,
)
from trispec.drafters.ngram import NgramDrafter
from trispec.request import GenerationRequest

NUM_PROMPTS = 20
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return repeating_prompts(NUM_PROMPTS)


@pytest.fixture(scope="module")
def references(prompts: list[list[int]]) -> list[list[int]]:
    return [reference_greedy(p, MAX_TOKENS) for p in prompts]


def test_target_is_not_degenerate(references: list[list[int]]) -> None:
    # exactness against a constant output would prove nothing
    assert len({tuple(r) for r in references}) == len(references)
    assert sum(len(set(r)) > 10 for r in references) >= 15


DRAFTERS = {
    "bf16-self": lambda: model_drafter(0, dtype="bfloat16"),
    "other-model": lambda: model_drafter(7),
    "ngram": lambda: NgramDrafter(tiny_engine(0).vocab_size, max_ngram=3),
}


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter_name", list(DRAFTERS))
def test_greedy_speculative_equals_target(
    k: int, drafter_name: str, prompts: list[list[int]], references: list[list[int]]
) -> None:
    target = tiny_engine(0)
    drafter = DRAFTERS[drafter_name]()
    llm = spec_engine(target, drafter)
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=k))
        for p in prompts
    ]
    outputs = run_to_completion(llm)
    for request_id, ref in zip(ids, references):
        assert tokens_of(outputs[request_id]) == ref
    stats = llm.stats
    assert stats.draft_tokens > 0
    if drafter_name == "bf16-self":
        # a bf16 copy of the target agrees almost always: the test exercises long accepted runs
        assert stats.acceptance_rate > 0.5
    assert stats.max_verify_batch > 1
    # both pools back to full once idle
    assert target.kv_usage().used_blocks == 0
    if hasattr(drafter, "engine"):
        assert drafter.engine.kv_usage().used_blocks == 0


def test_batching_invariance_staggered_mixed_k(prompts: list[list[int]]) -> None:
    """16 requests arriving over several steps with different k give the tokens each gives alone."""
    ks = [0, 1, 2, 3, 4, 5, 6, 8] * 2

    def alone(prompt: list[int], k: int) -> list[int]:
        llm = spec_engine(tiny_engine(0), model_drafter(3))
        rid = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=40, num_draft_tokens=k))
        return tokens_of(run_to_completion(llm)[rid])

    expected = [alone(p, k) for p, k in zip(prompts[:16], ks)]

    llm = spec_engine(tiny_engine(0), model_drafter(3))
    outputs: dict[int, list] = {}
    ids = []
    for i, (prompt, k) in enumerate(zip(prompts[:16], ks)):
        ids.append(
            llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=40, num_draft_tokens=k))
        )
        for _ in range(i % 3):  # a few steps between arrivals
            for out in llm.step():
                outputs.setdefault(out.request_id, []).append(out)
    for rid, outs in run_to_completion(llm).items():
        outputs.setdefault(rid, []).extend(outs)
    assert [tokens_of(outputs[rid]) for rid in ids] == expected
    assert llm.stats.max_verify_batch >= 8


def test_seeded_sampling_is_batch_invariant(prompts: list[list[int]]) -> None:
    def run(batch: list[list[int]]) -> list[list[int]]:
        llm = spec_engine(tiny_engine(0), model_drafter(0, dtype="bfloat16"))
        ids = [
            llm.add_request(
                GenerationRequest(
                    prompt_token_ids=p, max_tokens=24, num_draft_tokens=4, temperature=0.8, seed=11 + i
                )
            )
            for i, p in enumerate(batch)
        ]
        outputs = run_to_completion(llm)
        return [tokens_of(outputs[rid]) for rid in ids]

    together = run(prompts[:6])
    assert together[0] == run(prompts[:1])[0]
    assert together == run(prompts[:6])  # reproducible with the same seeds
    assert len({tuple(t) for t in together}) == 6


def test_chunked_prefill_matches(prompts: list[list[int]]) -> None:
    long_prompt = [t for p in prompts[:6] for t in p]
    ref = reference_greedy(long_prompt, 16)
    llm = spec_engine(tiny_engine(0), model_drafter(7), max_prefill_tokens_per_step=7)
    rid = llm.add_request(GenerationRequest(prompt_token_ids=long_prompt, max_tokens=16, num_draft_tokens=3))
    outputs = run_to_completion(llm)
    assert tokens_of(outputs[rid]) == ref
    assert llm.stats.steps > len(long_prompt) // 7


def test_stats_are_consistent(prompts: list[list[int]]) -> None:
    llm = spec_engine(tiny_engine(0), model_drafter(0, dtype="bfloat16"))
    rid = llm.add_request(GenerationRequest(prompt_token_ids=prompts[0], max_tokens=50, num_draft_tokens=4))
    outputs = run_to_completion(llm)[rid]
    stats = outputs[-1].stats
    tokens = tokens_of(outputs)
    assert len(tokens) == 50
    assert stats.accepted_tokens == sum(stats.accepted_per_position)
    assert stats.accepted_per_position == sorted(stats.accepted_per_position, reverse=True)
    # every round emits its accepted drafts plus one target token (the last may be cut by max_tokens)
    assert stats.rounds + stats.accepted_tokens >= len(tokens) > stats.rounds + stats.accepted_tokens - 5
    assert stats.mean_accepted_length == pytest.approx(1 + stats.accepted_tokens / stats.rounds)
    assert 0 < stats.acceptance_rate <= 1


def test_plain_decoding_same_loop(prompts: list[list[int]], references: list[list[int]]) -> None:
    llm = spec_engine(tiny_engine(0), None)
    rid = llm.add_request(GenerationRequest(prompt_token_ids=prompts[2], max_tokens=MAX_TOKENS))
    outputs = run_to_completion(llm)[rid]
    assert tokens_of(outputs) == references[2]
    assert outputs[-1].stats.draft_tokens == 0
    assert outputs[-1].stats.rounds == MAX_TOKENS
