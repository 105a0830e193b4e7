"""The suffix drafter: its index on hand-made token lists (copied spans, voting, adaptive length,
incremental updates, the bounded global index), greedy exactness through the real scheduler on the
tiny models, one-hot q under sampling, and a bounded cost per step."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import pytest
import torch
from tiny import reference_greedy, repeating_prompts, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.drafters.base import DraftRequest
from trispec.drafters.suffix import KEY_LENGTHS, SuffixDrafter
from trispec.request import GenerationRequest
from trispec.sampling_params import SamplingParams

VOCAB = 320
GREEDY = SamplingParams()


def propose(
    drafter: SuffixDrafter, seq_id: int, tokens: Sequence[int], k: int = 8, sampling: SamplingParams = GREEDY
) -> list[int]:
    return drafter.propose([DraftRequest(seq_id, list(tokens), k, sampling, None)])[0].tokens


def fresh(tokens: Sequence[int], k: int = 8, **kw: object) -> list[int]:
    """Propose from an index built from scratch over ``tokens``."""
    drafter = SuffixDrafter(VOCAB, **kw)
    drafter.add_sequence(0, 4096)
    return propose(drafter, 0, tokens, k)


# -- the index -------------------------------------------------------------------------------------
SPAN = list(range(100, 140))  # say, a function in the prompt that the output re-types


def test_copied_span_is_proposed_with_adaptive_length() -> None:
    prompt = [1, 2, 3, *SPAN, 7, 8, 9]
    drafter = SuffixDrafter(VOCAB)
    drafter.add_sequence(0, 4096)
    assert propose(drafter, 0, prompt) == []  # 9 never occurred before: no match
    # a 3-token match drafts 3 tokens (max_spec_factor 1), a 10-token one the full k
    assert propose(drafter, 0, [*prompt, *SPAN[:3]]) == SPAN[3:6]
    assert propose(drafter, 0, [*prompt, *SPAN[:10]]) == SPAN[10:18]
    # past the span's end the walk follows what came after it: the prompt's tail, then the output
    assert propose(drafter, 0, [*prompt, *SPAN[:36]]) == [*SPAN[36:], 7, 8, 9, SPAN[0]]


def test_short_match_short_draft_long_match_up_to_k() -> None:
    tokens = [*SPAN, 5, *SPAN[:1]]
    assert fresh(tokens) == SPAN[1:2]  # 1-token match: 1 token
    assert fresh([*SPAN, 5, *SPAN[:30]], k=4) == SPAN[30:34]  # long match: k
    assert fresh([*SPAN, 5, *SPAN[:6]], max_spec_factor=0.5) == SPAN[6:9]
    assert fresh([*SPAN, 5, *SPAN[:6]], max_spec_factor=2.0) == SPAN[6:14]
    assert fresh([*SPAN, 5, *SPAN[:6]], k=0) == []
    # max_depth caps the match length, hence the draft
    assert fresh([*SPAN, 5, *SPAN[:20]], k=8, max_depth=4) == SPAN[20:24]


def test_no_match_no_draft() -> None:
    assert fresh([]) == []
    assert fresh([42]) == []
    assert fresh(list(range(50))) == []


def test_most_frequent_continuation_wins() -> None:
    a, b, c = 50, 51, 52
    x, y = 60, 61
    # "a b c" follows distinct tokens each time, so every occurrence matches exactly 3 deep
    tokens = [10, a, b, c, x, 70, 11, a, b, c, y, 71, 12, a, b, c, x, 72, 13, a, b, c, x, 73, 14, a, b, c]
    assert fresh(tokens, k=1) == [x]
    # a 2-2 tie goes to the latest occurrence
    tie = [10, a, b, c, x, 70, 11, a, b, c, y, 71, 12, a, b, c, x, 72, 13, a, b, c, y, 73, 14, a, b, c]
    assert fresh(tie, k=1) == [y]
    # 3 of 4 votes give p = 0.75: a threshold above it drafts nothing
    assert fresh(tokens, k=1, min_token_prob=0.8) == []


def test_longest_match_beats_frequency() -> None:
    # "b c" is followed by x three times, but the one occurrence that matches "a b c" says y
    a, b, c, x, y = 50, 51, 52, 60, 61
    tokens = [9, b, c, x, 8, b, c, x, 7, b, c, x, 6, a, b, c, y, 5, a, b, c]
    assert fresh(tokens, k=1) == [y]


def test_walk_stops_when_the_probability_drops() -> None:
    # after "a b c" the votes agree on x, then split 4 ways: the draft stops after x
    a, b, c, x = 50, 51, 52, 60
    tokens = []
    for pre, post in zip([10, 11, 12, 13], [80, 81, 82, 83]):
        tokens += [pre, a, b, c, x, post, 99]
    assert fresh([*tokens, 14, a, b, c], k=3, min_token_prob=0.3) == [x]
    # p = 0.25 passes 0.2: the latest of the four wins, and its one candidate carries on alone
    assert fresh([*tokens, 14, a, b, c], k=3, min_token_prob=0.2) == [x, 83, 99]


def brute_force(tokens: list[int], k: int, max_depth: int, min_token_prob: float) -> list[int]:
    """A depth-capped suffix-tree walk written plainly: every earlier occurrence of the longest
    matching suffix votes at every step."""
    n = len(tokens)

    def match(p: int) -> int:
        length = 0
        while length < min(max_depth, p) and tokens[p - length - 1] == tokens[n - length - 1]:
            length += 1
        return length

    lengths = {p: match(p) for p in range(1, n)}
    best = max(lengths.values(), default=0)
    if best == 0:
        return []
    candidates = [p for p in range(n - 1, 0, -1) if lengths[p] == best]
    out: list[int] = []
    prob = 1.0
    for j in range(min(k, best)):
        votes: dict[int, int] = {}
        for p in candidates:
            if p + j < n:
                votes[tokens[p + j]] = votes.get(tokens[p + j], 0) + 1
        if not votes:
            break
        token = max(votes, key=votes.__getitem__)
        prob *= votes[token] / sum(votes.values())
        if prob < min_token_prob:
            break
        out.append(token)
        candidates = [p for p in candidates if p + j < n and tokens[p + j] == token]
    return out


def repetitive_stream(seed: int, length: int) -> list[int]:
    """Tokens from a 6-token alphabet with copied chunks: many matches of every length."""
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(20)]
    while len(tokens) < length:
        if rng.random() < 0.5:
            start = rng.randrange(len(tokens) - 5)
            tokens += tokens[start : start + rng.randrange(3, 15)]
        else:
            tokens += [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
    return tokens[:length]


@pytest.mark.parametrize("seed", range(3))
def test_incremental_equals_from_scratch_equals_brute_force(seed: int) -> None:
    stream = repetitive_stream(seed, 300)
    rng = random.Random(seed)
    incremental = SuffixDrafter(VOCAB, max_depth=12, max_candidates=10**9)
    incremental.add_sequence(0, 4096)
    n = 10
    while n < len(stream):
        k = rng.randrange(1, 9)
        got = propose(incremental, 0, stream[:n], k)
        assert got == fresh(stream[:n], k, max_depth=12, max_candidates=10**9)
        assert got == brute_force(stream[:n], k, 12, 0.1)
        n += rng.randrange(1, 4)  # one to three verified tokens per round


def test_bounded_candidates_still_propose() -> None:
    stream = repetitive_stream(7, 2000)
    drafter = SuffixDrafter(VOCAB, max_candidates=4)
    drafter.add_sequence(0, 4096)
    drafted = sum(bool(propose(drafter, 0, stream[:n], 4)) for n in range(1000, 2000))
    assert drafted > 900
    # at most max_candidates per key length per index, whatever the sequence length
    assert drafter.num_examined <= 1000 * 4 * len(KEY_LENGTHS)


def test_global_index_drafts_for_similar_outputs_and_only_outputs() -> None:
    rng = random.Random(0)
    prompt_a = [rng.randrange(256) for _ in range(40)]
    output_a = [rng.randrange(256) for _ in range(60)]
    drafter = SuffixDrafter(VOCAB)
    drafter.add_sequence(0, 4096)
    propose(drafter, 0, prompt_a)  # the first propose marks where the prompt ends
    propose(drafter, 0, prompt_a + output_a)
    prompt_b = list(range(256, 276))  # shares nothing with A
    drafter.add_sequence(1, 4096)
    assert propose(drafter, 1, prompt_b + output_a[:6]) == []  # A still running: not global yet
    drafter.free(0)
    assert drafter.global_size == len(output_a) + 1
    drafter.add_sequence(2, 4096)
    assert propose(drafter, 2, prompt_b) == []
    assert propose(drafter, 2, prompt_b + output_a[:6]) == output_a[6:12]
    assert propose(drafter, 2, prompt_b + output_a[:20]) == output_a[20:28]
    # A's prompt did not join the global index
    drafter.add_sequence(3, 4096)
    assert propose(drafter, 3, prompt_b + prompt_a[:10]) == []
    # a freed sequence's own index is gone; its id starts over
    assert 0 not in drafter._seqs


def test_global_index_is_bounded_and_evicts_the_oldest() -> None:
    drafter = SuffixDrafter(5000, global_tokens=400)
    # outputs with no token in common, so that a draft can only come from the same output
    outputs = [list(range(i * 60, i * 60 + 60)) for i in range(20)]
    for seq_id, output in enumerate(outputs):
        drafter.add_sequence(seq_id, 4096)
        propose(drafter, seq_id, [4000])  # a 1-token prompt
        propose(drafter, seq_id, [4000, *output])
        drafter.free(seq_id)
        assert drafter.global_size <= 400
    probe = 1000

    def drafts_for(output: list[int]) -> list[int]:
        nonlocal probe
        probe += 1
        drafter.add_sequence(probe, 4096)
        return propose(drafter, probe, [4001, *output[:10]])

    assert drafts_for(outputs[-1]) == outputs[-1][10:18]  # recent: still there
    assert drafts_for(outputs[0]) == []  # oldest: evicted
    # an output longer than the whole cap keeps its tail
    drafter.add_sequence(99, 4096)
    propose(drafter, 99, [4000])
    huge = list(range(2000, 3000))
    propose(drafter, 99, [4000, *huge])
    drafter.free(99)
    assert drafter.global_size <= 400
    assert drafts_for(huge[-50:]) == huge[-40:-32]


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
