"""A failed round's undo rolls the draft cache back to what it held before the round (issue 54, item
2). A drafting request takes what the draft pool's prefix cache holds of its prompt at admission; the
target may hold less (its own cache evicted it) and computes its prompt in chunks, so the draft cache
legitimately holds more of the prompt than the target has computed. Cutting the draft back to the
target's length there would cut inside a draft block: refused when another sequence shares that
block (and drafting then went off for the whole process), or, for its only holder, a valid cached
block taken out of the index."""

from __future__ import annotations

import random

from tiny import FaultyEngine, run_to_completion, spec_engine, tiny_engine
from trispec.drafters.model_drafter import ModelDrafter
from trispec.request import GenerationRequest
from trispec.sequence import FinishReason

_rng = random.Random(2)
TEXT = [_rng.randrange(256) for _ in range(60)]


def build():  # type: ignore[no-untyped-def]
    target = tiny_engine(0)
    faulty = FaultyEngine(target, set())
    # the draft model has the target's weights: its drafts are accepted wherever its cache is right
    drafter = ModelDrafter(tiny_engine(0))
    llm = spec_engine(faulty, drafter, max_prefill_tokens_per_step=12)  # type: ignore[arg-type]
    # both pools cache the text's first 22 tokens; then the target's cache loses them (evicted)
    llm.add_request(GenerationRequest(prompt_token_ids=TEXT[:22], max_tokens=6, num_draft_tokens=2))
    run_to_completion(llm)
    target.drop_prefix_cache()
    return llm, faulty, drafter


def request() -> GenerationRequest:
    return GenerationRequest(prompt_token_ids=TEXT[:40], max_tokens=12, num_draft_tokens=4)


def fail_after_first_chunk(llm, faulty: FaultyEngine, rid: int) -> None:  # type: ignore[no-untyped-def]
    """Request ``rid``'s first prompt chunk (12 tokens: inside the draft pool's second block) runs,
    then its next round fails in the target: undone, and it fails alone."""
    llm.step()
    seq = next(s for s in llm.scheduler.running if s.seq_id == rid)
    assert (seq.num_computed, seq.draft_synced) == (12, 22)  # the draft holds 2 blocks and 6 copied
    faulty.poisoned.add(rid)
    outputs = run_to_completion(llm)
    assert faulty.failures == 1 and outputs[rid][-1].finish_reason is FinishReason.ERROR


def test_an_undo_inside_a_draft_block_another_sequence_shares_leaves_drafting_on() -> None:
    llm, faulty, drafter = build()
    failing = llm.add_request(request())
    llm.add_request(request())  # admitted beside it: the same draft blocks
    fail_after_first_chunk(llm, faulty, failing)  # (it runs the sharing request to its end too)
    assert not llm.runner.drafting_off
    later = llm.add_request(request())
    outputs = run_to_completion(llm)
    assert outputs[later][-1].stats.accepted_tokens > 0  # drafted, and the drafts were right
    drafter.engine.blocks.check()


def test_an_undo_keeps_the_draft_pools_cached_blocks_its_only_holder_matched() -> None:
    llm, faulty, drafter = build()
    failing = llm.add_request(request())
    fail_after_first_chunk(llm, faulty, failing)
    assert not llm.runner.drafting_off
    llm.add_request(request())
    llm.step()
    (seq,) = llm.scheduler.running
    assert seq.draft_synced == 22  # both full blocks are still cached, and the third's start
    run_to_completion(llm)
    drafter.engine.blocks.check()
