"""The suffix drafter's index on hand-made token lists: copied spans with adaptive length, voting for
the most frequent continuation, the longest match, the walk stopping where the probability drops,
incremental updates equal to building from scratch (and to brute force), the bounded global index
that drafts only from outputs and evicts the oldest.
"""

from __future__ import annotations

import random

import pytest
from suffix_tokens import SPAN, VOCAB, fresh, propose, repetitive_stream
from trispec.drafters.suffix import KEY_LENGTHS, SuffixDrafter


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
