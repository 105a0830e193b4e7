"""The draft pool's prefix cache through the scheduler and the runner (issue 54, item 1): a drafting
request takes what the draft pool holds of its prompt at admission, then the draft pool is told what
is verified as the target's prompt chunks progress; where the target holds less of the prompt than
the draft pool (its own cache evicted it), that progress lags what the draft pool matched, ends
inside a block, and the request may be cancelled before the target catches up. A later request must
still find, in the draft pool, only keys and values of its own prefix: the same text as on cold
engines under the rejection rule with a seed (where the draft's distribution decides the draws), and
the same acceptance under greedy."""

from __future__ import annotations

import random

import pytest
from tiny import run_to_completion, spec_engine, tiny_engine
from trispec.drafters.model_drafter import ModelDrafter
from trispec.request import GenerationRequest

_rng = random.Random(54)
TEXT = [_rng.randrange(256) for _ in range(200)]
FILLER = [_rng.randrange(256) for _ in range(88)]


def build(rule: str):  # type: ignore[no-untyped-def]
    # a target pool of 96 tokens (another request evicts its cache), a roomy draft pool; the draft
    # model has the target's weights, so that its drafts are accepted wherever its cache is right
    target = tiny_engine(0, num_blocks=12)
    drafter = ModelDrafter(tiny_engine(0, num_blocks=64))
    llm = spec_engine(target, drafter, sampling_rule=rule, max_prefill_tokens_per_step=10, max_context=96)
    return llm, target, drafter


def request(prompt: list[int], sampled: bool, k: int = 4, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        num_draft_tokens=k,
        temperature=0.9 if sampled else 0.0,
        seed=7 if sampled else None,
    )


def final(llm, req: GenerationRequest):  # type: ignore[no-untyped-def]
    rid = llm.add_request(req)
    outputs = run_to_completion(llm)[rid]
    return [t for o in outputs for t in o.new_token_ids], outputs[-1].stats.accepted_tokens


@pytest.mark.parametrize(("rule", "sampled"), [("rejection", True), ("coupled", False)])
def test_a_draft_pool_sealed_behind_what_it_matched_and_cancelled_serves_only_its_own_prefix(
    rule: str, sampled: bool
) -> None:
    later = request([*TEXT[:16], *TEXT[8:30]], sampled)  # from position 16 it repeats the text from 8
    assert TEXT[8] != TEXT[16]
    cold, _, _ = build(rule)
    expected = final(cold, later)

    llm, target, drafter = build(rule)
    final(llm, request(TEXT[:22], sampled, k=2, max_tokens=6))  # both pools cache the text's start
    final(llm, request(FILLER, sampled, k=0, max_tokens=4))  # the target's pool evicts it
    assert target.kv_usage().cached_blocks and target.blocks.probe(TEXT[:22]) == (0, 0)
    # admitted, it takes 2 full blocks of the draft pool and copies 6 tokens of the third; the target
    # holds none, so its first prompt chunk (10 tokens) is what the draft pool is sealed with
    rid = llm.add_request(request(TEXT[:40], sampled))
    llm.step()
    (seq,) = llm.scheduler.running
    assert seq.draft_synced == 22 and seq.num_computed == 10
    llm.cancel(rid)
    run_to_completion(llm)
    assert final(llm, later) == expected
    target.blocks.check()
    drafter.engine.blocks.check()
