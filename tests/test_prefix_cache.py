"""The prefix cache's books (``BlockManager``): chained keys, sharing, salts, LRU eviction, and the
invariant free + cached + in use == the pool after thousands of random requests."""

from __future__ import annotations

import random

import pytest
from trispec.engine.block_manager import BlockManager
from trispec.errors import CapacityError

BS = 4


def sealed(bm: BlockManager, seq_id: int, tokens: list[int], salt: str = "") -> int:
    """A request as the runner makes one: registered, matched, the rest appended, all sealed."""
    bm.add(seq_id, 1000, salt)
    hit = bm.match(seq_id, tokens).length
    bm.append(seq_id, len(tokens) - hit)
    bm.seal(seq_id, tokens)
    return hit


def test_a_repeated_prompt_reuses_its_full_blocks_but_computes_its_last_token() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    assert sealed(bm, 0, prompt) == 0
    table = list(bm.block_table(0))
    bm.free(0)
    # kept after its user finished: the two full blocks and the verified start of the third
    assert bm.cached_blocks == 3 and bm.used_blocks == 0
    assert sealed(bm, 1, prompt) == 9  # 8 in shared blocks, 1 copied from the third: all but the last
    assert bm.block_table(1)[:2] == table[:2] and bm.block_table(1)[2] != table[2]
    bm.free(1)
    bm.add(2, 100)
    match = bm.match(2, list(range(8)))  # block-aligned: the second block's first 3 are copied
    assert (match.length, match.copy_from, match.copy_tokens) == (7, table[1], 3)
    bm.check()


def test_a_conversations_next_turn_computes_only_what_it_adds() -> None:
    bm = BlockManager(16, BS)
    turn1, answer = list(range(10)), [50, 51, 52, 53]
    bm.add(0, 100)
    bm.append(0, 10)
    bm.seal(0, turn1)
    bm.append(0, 3)  # the answer's tokens but the last are fed back and verified
    bm.seal(0, turn1 + answer[:3])
    bm.free(0)
    turn2 = [*turn1, *answer, 60, 61, 62, 63, 64, 65]
    assert sealed(bm, 1, turn2) == 13  # 3 shared blocks + the verified start of the fourth
    bm.check()


def test_blocks_are_shared_with_reference_counts_and_only_full_verified_ones() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(9))
    sealed(bm, 0, prompt)
    bm.add(1, 100)
    assert bm.match(1, [*prompt[:8], 99, 98]).length == 8  # both full blocks, not the partial third
    assert bm.block_table(1)[:2] == bm.block_table(0)[:2]
    assert bm.used_blocks == 3  # shared blocks count once
    bm.free(0)
    assert bm.used_blocks == 2 and bm.cached_blocks == 1  # held by 1; 0's last block kept
    bm.free(1)
    assert bm.cached_blocks == 3
    bm.check()


def test_unsealed_blocks_are_never_found() -> None:
    bm = BlockManager(16, BS)
    bm.add(0, 100)
    bm.append(0, 12)  # computed but not verified (drafts, say)
    bm.add(1, 100)
    assert bm.match(1, list(range(13))).length == 0
    bm.seal(0, list(range(5)))  # only the first block's tokens are verified
    bm.add(2, 100)
    assert bm.match(2, list(range(13))).length == 4
    bm.check()


def test_salts_and_prefixes_that_differ_early_never_share() -> None:
    bm = BlockManager(32, BS)
    prompt = list(range(12))
    sealed(bm, 0, prompt, salt="tenant-a")
    bm.add(1, 100, "tenant-b")
    assert bm.match(1, prompt).length == 0
    bm.add(2, 100)  # no salt is a namespace of its own
    assert bm.match(2, prompt).length == 0
    bm.add(3, 100, "tenant-a")
    assert bm.match(3, prompt).length == 11  # 2 shared blocks, 3 tokens of the third copied
    # a block is known by everything before it: the same second block after another first misses
    bm.add(4, 100, "tenant-a")
    assert bm.match(4, [7, *prompt[1:]]).length == 0
    assert bm.probe(prompt, "tenant-a") == (2, 0) and bm.probe(prompt, "tenant-c") == (0, 0)


def test_cached_blocks_are_evicted_least_recently_used_tail_first() -> None:
    bm = BlockManager(5, BS)
    a, b = list(range(13)), list(range(100, 113))
    sealed(bm, 0, a)  # 4 blocks, all cached when it ends (3 full, 1 partly filled)
    bm.free(0)
    sealed(bm, 1, b[:9])  # 3 blocks: the empty one + 2 evicted (a's tail, let go first)
    bm.free(1)
    assert bm.counters.evicted_blocks == 2
    bm.add(2, 100)
    assert bm.match(2, a).length == 8  # a's first two blocks are still there
    bm.free(2)
    # a fresh request takes every block it needs: the least recently used go first (b's, then a's)
    bm.add(3, 100)
    bm.append(3, 20)
    assert bm.cached_blocks == 0 and bm.counters.evicted_blocks == 7
    with pytest.raises(CapacityError):
        bm.append(3, 1)
    bm.check()


def test_rollback_never_touches_a_shared_block() -> None:
    bm = BlockManager(16, BS)
    prompt = list(range(10))
    sealed(bm, 0, prompt)
    bm.add(1, 100)
    assert bm.match(1, prompt).length == 8
    with pytest.raises(ValueError, match="shared"):
        bm.truncate(1, 6)  # would make the shared second block writable
    bm.truncate(1, 4)  # to a boundary: lets the second block go, shares nothing it writes
    assert bm.length(1) == 4
    # the sole holder cutting into its own sealed block takes it out of the index first
    bm.free(1)
    bm.truncate(0, 6)
    bm.add(2, 100)
    assert bm.match(2, prompt).length == 4
    bm.check()


def test_probe_counts_the_cached_blocks_an_admission_would_claim() -> None:
    bm = BlockManager(8, BS)
    prompt = list(range(13))
    sealed(bm, 0, prompt)
    assert bm.probe(prompt) == (3, 0)  # held by 0: claiming them takes nothing from the free count
    bm.free(0)
    assert bm.probe(prompt) == (3, 3) and bm.free_blocks == 8


def test_the_off_switch() -> None:
    bm = BlockManager(8, BS, prefix_caching=False)
    sealed(bm, 0, list(range(9)))
    bm.free(0)
    assert bm.cached_blocks == 0
    bm.add(1, 100)
    assert bm.match(1, list(range(9))).length == 0 and bm.probe(list(range(9))) == (0, 0)


def test_books_balance_after_thousands_of_random_requests() -> None:
    """Requests from a few shared prefixes, salted or not, with rounds of drafts rolled back,
    cancellations, preemptions (freed, re-admitted and recomputed) and pressure on a small pool."""
    rng = random.Random(40)
    bm = BlockManager(48, BS)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 30))] for _ in range(6)]
    live: dict[int, list[int]] = {}  # seq -> its verified tokens
    salts: dict[int, str] = {}
    hits = 0
    for seq_id in range(3000):
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 6))]
        salts[seq_id] = rng.choice(["", "", "x"])
        if bm.room_for({seq_id: len(prompt) + 4}):
            bm.add(seq_id, len(prompt) + 40, salts[seq_id])
            got = bm.match(seq_id, prompt).length
            hits += got > 0
            assert got < len(prompt)
            bm.append(seq_id, len(prompt) - got)
            bm.seal(seq_id, prompt)
            live[seq_id] = prompt
        for sid in rng.sample(sorted(live), min(len(live), 3)):
            tokens, roll = live[sid], rng.random()
            if roll < 0.1:  # cancelled
                bm.free(sid)
                del live[sid]
            elif roll < 0.2:  # preempted; re-admitted if there is room, recomputing what is not cached
                bm.free(sid)
                if not bm.room_for({sid: len(tokens)}):
                    del live[sid]
                    continue
                bm.add(sid, len(tokens) + 40, salts[sid])
                got = bm.match(sid, tokens).length
                bm.append(sid, len(tokens) - got)
                bm.seal(sid, tokens)
            else:  # a round: the tokens the cache lacks and k drafts in, some accepted, the rest rolled back
                k = rng.randrange(0, 5)
                grow_to = len(tokens) + k
                if grow_to > bm.max_length(sid) or not bm.room_for({sid: grow_to}):
                    continue
                bm.append(sid, grow_to - bm.length(sid))
                accepted = rng.randrange(0, k + 1)
                grown = tokens + [rng.randrange(50) for _ in range(accepted + 1)]  # + the target's own
                bm.truncate(sid, len(tokens) + accepted)
                bm.seal(sid, grown[: len(tokens) + accepted])
                live[sid] = grown
        bm.check()
    assert hits > 300 and bm.counters.evicted_blocks > 100
    for sid in list(live):
        bm.free(sid)
    bm.check()
    assert bm.used_blocks == 0 and bm.empty_blocks + bm.cached_blocks == bm.num_blocks


def test_dropping_the_cache_empties_every_block_no_sequence_holds() -> None:
    """``drop_cached`` (a cold cache without a restart): the cached blocks become empty and are never
    found again; the blocks running sequences hold stay theirs, and stay shared."""
    bm = BlockManager(16, BS)
    held, gone = list(range(10)), list(range(50, 60))
    sealed(bm, 0, held)
    sealed(bm, 1, gone)
    bm.free(1)
    assert bm.cached_blocks == 3 and bm.used_blocks == 3
    bm.drop_cached()
    assert bm.cached_blocks == 0 and bm.empty_blocks == 13 and bm.used_blocks == 3
    bm.add(2, 100)
    assert bm.match(2, gone).length == 0
    bm.add(3, 100)
    assert bm.match(3, held).length == 8  # 0's two full blocks, still in use and shared
    bm.check()
