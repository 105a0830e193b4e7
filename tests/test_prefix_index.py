"""``PrefixIndex.longest_start`` (a walk of a token trie per parent) finds what a scan of every block
under the parent finds, through thousands of random adds and removes, and its books stay consistent."""

from __future__ import annotations

import random

from trispec.engine.prefix_index import PrefixIndex


def scanned(blocks: dict[int, tuple[bytes, tuple[int, ...]]], parent: bytes, tokens: list[int]) -> int:
    """The longest run of ``tokens`` that some block under ``parent`` begins with, by brute force."""
    best = 0
    for block_parent, block_tokens in blocks.values():
        if block_parent != parent:
            continue
        run = 0
        for mine, theirs in zip(tokens, block_tokens):
            if mine != theirs:
                break
            run += 1
        best = max(best, run)
    return best


def test_longest_start_matches_a_scan_through_random_adds_and_removes() -> None:
    rng = random.Random(0)
    index = PrefixIndex()
    held: dict[int, tuple[bytes, tuple[int, ...]]] = {}
    parents = [bytes([p]) * 8 for p in range(3)]
    next_block = 0
    for step in range(4000):
        if held and rng.random() < 0.4:
            block = rng.choice(list(held))
            index.remove(block)
            del held[block]
        else:
            parent = rng.choice(parents)
            # few token values and a shared start: many siblings share a long run
            tokens = tuple([7, 7] + [rng.randrange(3) for _ in range(rng.randrange(1, 8))])
            if rng.random() < 0.5:
                index.add_partial(next_block, parent, tokens)
            else:
                assert index.add_full(next_block, parent, bytes([step % 256, step // 256]) * 4, tokens)
            held[next_block] = (parent, tokens)
            next_block += 1
        parent = rng.choice(parents)
        query = [7, 7] + [rng.randrange(3) for _ in range(rng.randrange(0, 9))]
        block, run = index.longest_start(parent, query)
        assert run == scanned(held, parent, query)
        if run:
            assert block is not None and held[block][0] == parent
            assert list(held[block][1][:run]) == query[:run]
        else:
            assert block is None
        if step % 500 == 0:
            index.check()
    index.check()
    assert len(index) == len(held)
    for block in list(held):
        index.remove(block)
    index.check()
    assert len(index) == 0 and index.longest_start(parents[0], [7]) == (None, 0)
