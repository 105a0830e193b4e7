"""The suffix drafter through the real scheduler on the tiny models: greedy exactness, one-hot q under
the rejection rule, seeded sampling reproducing, a bounded cost per step, seeded requests drafting
from their own index only under the rejection rule, and a model draft with suffix decoding beside
it. Its index on hand-made token lists: ``test_suffix_index.py``.
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from suffix_tokens import GREEDY, SPAN, VOCAB, propose, repetitive_stream
from tiny import reference_greedy, repeating_prompts, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.base import DraftRequest
from trispec.drafters.suffix import KEY_LENGTHS, SuffixDrafter
from trispec.request import GenerationRequest
from trispec.sampling_params import SamplingParams

# -- through the scheduler -------------------------------------------------------------------------
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return repeating_prompts(12)


@pytest.fixture(scope="module")
def references(prompts: list[list[int]]) -> list[list[int]]:
    return [reference_greedy(p, MAX_TOKENS) for p in prompts]


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculative_equals_target(
    k: int, prompts: list[list[int]], references: list[list[int]]
) -> None:
    target = tiny_engine(0)
    drafter = SuffixDrafter(target.vocab_size)
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
    assert stats.accepted_tokens > 0
    assert target.kv_usage().used_blocks == 0
    # every request was freed: no per-request index is left, their outputs went global
    assert not drafter._seqs
    assert 0 < drafter.global_size <= len(prompts) * (MAX_TOKENS + 1)


def test_sampled_proposals_are_one_hot_under_the_rejection_rule() -> None:
    drafter = SuffixDrafter(VOCAB)
    drafter.add_sequence(0, 4096)
    sampled = SamplingParams(temperature=0.8, seed=3, rule="rejection")
    tokens = [*SPAN, 5, *SPAN[:10]]
    (proposal,) = drafter.propose([DraftRequest(0, tokens, 4, sampled, torch.Generator().manual_seed(3))])
    assert proposal.tokens == SPAN[10:14]
    assert proposal.probs is not None
    assert proposal.probs.shape == (4, VOCAB)
    assert proposal.probs.argmax(dim=-1).tolist() == proposal.tokens
    assert torch.equal(proposal.probs.sum(dim=-1), torch.ones(4))
    # greedy: no probs; no tokens: no probs
    assert drafter.propose([DraftRequest(0, tokens, 4, GREEDY, None)])[0].probs is None
    (empty,) = drafter.propose([DraftRequest(1, [7, 8, 9], 4, sampled, None)])
    assert empty.tokens == []
    # the coupled rule checks tokens only: no q
    coupled = SamplingParams(temperature=0.8, seed=3)
    (plain,) = drafter.propose([DraftRequest(0, tokens, 4, coupled, None)])
    assert plain.tokens == SPAN[10:14] and plain.probs is None
    assert empty.probs is None


def test_seeded_sampling_reproduces(prompts: list[list[int]]) -> None:
    def run() -> tuple[list[list[int]], int]:
        target = tiny_engine(0)
        llm = spec_engine(target, SuffixDrafter(target.vocab_size))
        ids = [
            llm.add_request(
                GenerationRequest(
                    prompt_token_ids=p, max_tokens=24, num_draft_tokens=4, temperature=0.8, seed=11 + i
                )
            )
            for i, p in enumerate(prompts[:6])
        ]
        outputs = run_to_completion(llm)
        return [tokens_of(outputs[rid]) for rid in ids], llm.stats.draft_tokens

    first, drafted = run()
    assert drafted > 0
    assert run() == (first, drafted)
    assert len({tuple(t) for t in first}) == 6


# -- cost ------------------------------------------------------------------------------------------
def test_cost_per_step_is_bounded() -> None:
    """32 sequences of 2000 tokens, one token appended per step: each step indexes exactly one
    position per key length per sequence and examines a bounded number of candidates, whatever the
    length; the wall time bound is generous (measured well under 1 ms on a laptop-class CPU)."""
    num_seqs, length, steps = 32, 2000, 200
    streams = [repetitive_stream(seed, length) for seed in range(num_seqs)]
    drafter = SuffixDrafter(VOCAB)
    for s in range(num_seqs):
        drafter.add_sequence(s, 4096)
    start = length - steps
    drafter.propose([DraftRequest(s, streams[s][:start], 8, GREEDY, None) for s in range(num_seqs)])
    assert drafter.num_indexed == num_seqs * start * len(KEY_LENGTHS)
    indexed, examined = drafter.num_indexed, drafter.num_examined
    # the requests hold the live token lists, as the scheduler's do: appending is not part of the cost
    live = [streams[s][:start] for s in range(num_seqs)]
    requests = [DraftRequest(s, live[s], 8, GREEDY, None) for s in range(num_seqs)]
    elapsed = 0.0
    drafted = 0
    for n in range(start, length):
        for s in range(num_seqs):
            live[s].append(streams[s][n])
        t0 = time.perf_counter()
        proposals = drafter.propose(requests)
        elapsed += time.perf_counter() - t0
        drafted += sum(len(p.tokens) for p in proposals)
    assert drafter.num_indexed - indexed == steps * num_seqs * len(KEY_LENGTHS)
    assert drafter.num_examined - examined <= steps * num_seqs * drafter.max_candidates * len(KEY_LENGTHS)
    assert drafted > steps * num_seqs  # the streams repeat: most steps draft
    per_step_ms = elapsed / steps * 1e3
    print(f"suffix drafter: {per_step_ms:.3f} ms per step for {num_seqs} x {length}-token sequences")
    assert per_step_ms < 20


def test_seeded_sampled_requests_draft_from_their_own_index_only_under_the_rejection_rule() -> None:
    """Under the rejection rule a seeded request's output depends on its drafts; drafts from other
    requests' outputs would tie it to whatever else ran. Greedy, unseeded and coupled requests (whose
    output does not depend on the drafts) use the global index."""
    rng = random.Random(3)
    output_a = [rng.randrange(256) for _ in range(60)]
    drafter = SuffixDrafter(VOCAB)
    drafter.add_sequence(0, 4096)
    propose(drafter, 0, [300, 301])
    propose(drafter, 0, [300, 301, *output_a])
    drafter.free(0)
    prompt = [310, 311, *output_a[:8]]
    for seq_id, sampling, expected in [
        (1, GREEDY, output_a[8:12]),
        (2, SamplingParams(temperature=0.8, rule="rejection"), output_a[8:12]),
        (3, SamplingParams(temperature=0.8, seed=5, rule="rejection"), []),
        (4, SamplingParams(temperature=0.0, seed=5, rule="rejection"), output_a[8:12]),  # greedy
        (5, SamplingParams(temperature=0.8, seed=5), output_a[8:12]),  # coupled
    ]:
        drafter.add_sequence(seq_id, 4096)
        assert propose(drafter, seq_id, prompt, k=4, sampling=sampling) == expected


# -- beside a model drafter ------------------------------------------------------------------------
def test_with_suffix_skips_the_model_where_the_suffix_drafts_k() -> None:
    from tiny import model_drafter
    from trispec.drafters.with_suffix import WithSuffix

    model = model_drafter(0)
    drafter = WithSuffix(model, SuffixDrafter(VOCAB))
    tokens = [*SPAN, 5, *SPAN[:10]]
    drafter.add_sequence(0, 512)
    drafter.add_sequence(1, 512)
    no_match = [7, 8, 9, 10]
    proposals = drafter.propose(
        [DraftRequest(0, tokens, 4, GREEDY, None), DraftRequest(1, no_match, 4, GREEDY, None)]
    )
    assert proposals[0].tokens == SPAN[10:14]  # the suffix index's proposal
    assert len(proposals[1].tokens) == 4  # the model's
    assert (drafter.num_suffix_proposals, drafter.num_model_proposals) == (1, 1)
    assert model.engine.cached_length(0) == 0  # sequence 0 never reached the model
    assert model.engine.cached_length(1) == len(no_match) + 3
    # where the suffix falls short of k, the model drafts: it catches up on the whole sequence
    drafter.rollback(1, len(no_match))
    longer = [*tokens, 77, 78]
    (proposal,) = drafter.propose([DraftRequest(0, longer, 4, GREEDY, None)])
    assert len(proposal.tokens) == 4
    assert model.engine.cached_length(0) == len(longer) + 3
    drafter.free(0)
    drafter.free(1)
    assert model.engine.kv_usage().used_blocks == 0


def test_with_suffix_greedy_equals_target(prompts: list[list[int]], references: list[list[int]]) -> None:
    from tiny import model_drafter
    from trispec.drafters.with_suffix import WithSuffix

    target = tiny_engine(0)
    drafter = WithSuffix(model_drafter(0, dtype="bfloat16"), SuffixDrafter(target.vocab_size))
    llm = spec_engine(target, drafter)
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=4))
        for p in prompts
    ]
    outputs = run_to_completion(llm)
    for request_id, ref in zip(ids, references):
        assert tokens_of(outputs[request_id]) == ref
    assert drafter.num_suffix_proposals > 0 and drafter.num_model_proposals > 0
    assert target.kv_usage().used_blocks == 0
    assert drafter.model.engine.kv_usage().used_blocks == 0
