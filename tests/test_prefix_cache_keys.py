"""Every block the prefix cache offers holds what its key says (issue 54, item 1): a block is indexed
under the chain of the tokens it actually holds, whatever order a pool is matched, sealed, cut back
and freed in. The draft pool is the hard case: it matches its own cache at admission, then is sealed
with the target's progress (often behind what it matched, and not on a block boundary), and may be
cancelled or preempted in between. A shadow of the pool records, for every slot, the whole prefix
whose keys and values were written there; whatever ``match`` hands a sequence must be that
sequence's own prefix, slot by slot."""

from __future__ import annotations

import random

from trispec.engine.block_manager import BlockManager

BS = 4


def test_a_partial_copy_is_never_offered_as_the_continuation_of_a_block_it_does_not_continue() -> None:
    """The issue's reproduction: a second sequence matches all 14 tokens of a cached text (3 full
    blocks and a 2-token copy into a new block), is sealed with only its first 6 and freed; a third
    sequence whose tokens 12-13 are the text's tokens 4-5 must not be offered that copy."""
    bm = BlockManager(32, BS)
    text = list(range(100, 120))
    bm.add(0, 100)
    bm.append(0, 14)
    bm.seal(0, text[:14])
    bm.free(0)
    bm.add(1, 100)
    match = bm.match(1, text[:15])
    assert (match.length, match.copy_tokens) == (14, 2)  # 3 shared blocks, 2 tokens copied
    bm.seal(1, text[:6])  # the target's progress: behind what the pool matched
    bm.free(1)
    bm.add(2, 100)
    third = [*text[:12], *text[4:6], 7]
    match = bm.match(2, third)
    # no cached block after the text's first 12 tokens holds the text's tokens 4-5 there
    assert (match.length, match.copy_tokens) == (12, 0)
    bm.check()


class ShadowPool:
    """A ``BlockManager`` and, beside it, what each slot of each block holds: the prefix (every token
    up to and including the slot's) whose keys and values were computed there."""

    def __init__(self, num_blocks: int) -> None:
        self.bm = BlockManager(num_blocks, BS)
        self.slots: dict[int, list[tuple[int, ...] | None]] = {}
        self.offered = 0  # tokens matches handed out (the test must exercise the cache)

    def written(self, seq_id: int, tokens: list[int], start: int) -> None:
        table = self.bm.block_table(seq_id)
        for pos in range(start, len(tokens)):
            self.slots.setdefault(table[pos // BS], [None] * BS)[pos % BS] = tuple(tokens[: pos + 1])

    def add_and_match(self, seq_id: int, tokens: list[int], salt: str = "") -> int:
        self.bm.add(seq_id, 1000, salt)
        return self.match(seq_id, tokens)

    def match(self, seq_id: int, tokens: list[int]) -> int:
        before = self.bm.length(seq_id)
        match = self.bm.match(seq_id, tokens)
        if match.copy_tokens:
            source = self.slots[match.copy_from]
            self.slots[match.copy_to] = [*source[: match.copy_tokens], *[None] * (BS - match.copy_tokens)]
        table = self.bm.block_table(seq_id)
        for pos in range(before, match.length):
            held = self.slots[table[pos // BS]][pos % BS]
            assert held == tuple(tokens[: pos + 1]), f"seq {seq_id} was offered another prefix's KV at {pos}"
        self.offered += match.length - before
        return match.length

    def feed(self, seq_id: int, tokens: list[int]) -> None:
        """Compute the sequence's tokens up to ``len(tokens)`` (they may include unverified drafts)."""
        start = self.bm.length(seq_id)
        self.bm.append(seq_id, len(tokens) - start)
        self.written(seq_id, tokens, start)


def test_every_block_the_cache_offers_holds_its_own_prefix_through_random_draft_pool_traffic() -> None:
    """Thousands of sequences over a few shared texts: matched at admission (and again when caught
    up at a block boundary), fed in chunks, sealed with a progress that may lag what the pool holds,
    drafts fed and rolled back, cancelled or preempted at any point, in a pool small enough to evict."""
    rng = random.Random(54)
    pool = ShadowPool(40)
    bm = pool.bm
    texts = [[rng.randrange(3) for _ in range(40)] for _ in range(4)]
    live: dict[int, tuple[list[int], int]] = {}  # seq -> its tokens, how many the "target" verified
    for seq_id in range(2500):
        text = rng.choice(texts)
        tokens = text[: rng.randrange(3, 36)]
        # from a block boundary on, it repeats an earlier part of its text
        if len(tokens) >= BS and rng.random() < 0.4:
            cut = BS * rng.randrange(1, 1 + len(tokens) // BS)
            start = rng.randrange(cut)
            tokens = [*tokens[:cut], *text[start : start + rng.randrange(2, 10)]]
        if bm.room_for({seq_id: len(tokens) + 6}):
            pool.add_and_match(seq_id, tokens)
            live[seq_id] = (tokens, 0)
        for sid in rng.sample(sorted(live), min(len(live), 3)):
            tokens, progress = live[sid]
            roll = rng.random()
            if roll < 0.12:  # cancelled, or preempted and (maybe) re-admitted
                bm.free(sid)
                del live[sid]
                if roll < 0.06 and bm.room_for({sid: len(tokens) + 6}):
                    pool.add_and_match(sid, tokens)
                    live[sid] = (tokens, 0)
            elif roll < 0.45:  # the target's chunk progress; this pool is sealed with it, not more
                progress = min(progress + rng.randrange(1, 9), len(tokens))
                if bm.length(sid) < progress and bm.room_for({sid: progress}):
                    pool.match(sid, tokens[:progress])
                    pool.feed(sid, tokens[:progress])
                bm.seal(sid, tokens[:progress])
                live[sid] = (tokens, progress)
            else:  # a draft round: catch up from the cache, feed the rest and k drafts, roll back
                k = rng.randrange(0, 4)
                drafts = [rng.randrange(3) for _ in range(k)]
                if not bm.room_for({sid: len(tokens) + k}):
                    continue
                pool.match(sid, tokens)
                pool.feed(sid, [*tokens, *drafts])
                accepted = rng.randrange(0, k + 1)
                grown = [*tokens, *drafts[:accepted], rng.randrange(3)]  # + the target's own token
                bm.truncate(sid, len(tokens) + accepted)
                bm.seal(sid, grown[: rng.randrange(progress, len(tokens) + accepted + 1)])
                live[sid] = (grown, len(tokens) + accepted)
        bm.check()
    assert pool.offered > 10_000 and bm.counters.evicted_blocks > 100
