"""Paged KV cache: block manager bookkeeping and speculative rollback ("Rollback" acceptance item)."""

from __future__ import annotations

import random

import pytest
import torch
from tiny import tiny_args
from trispec.engine.base import ForwardInput
from trispec.engine.kv_cache import BlockManager, KVCache, blocks_for
from trispec.engine.torch_engine import TorchEngine
from trispec.errors import CapacityError, ConfigError

ARGS = tiny_args("llama", 288, tie_embeddings=True)


# -- BlockManager unit tests ---------------------------------------------------------------------


def test_blocks_for() -> None:
    assert [blocks_for(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_free_list_and_allocation_on_demand() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    bm.add(1, max_length=10)  # registers; takes no block
    assert bm.free_blocks == 10 and bm.used_blocks == 0
    bm.append(1, 1)
    assert bm.block_table(1) == [0] and bm.length(1) == 1
    bm.append(1, 4)  # 5 tokens -> 2 blocks
    assert len(bm.block_table(1)) == 2 and bm.free_blocks == 8
    bm.add(2, max_length=4)
    bm.append(2, 4)
    tables = bm.block_table(1) + bm.block_table(2)
    assert len(set(tables)) == 3  # no block handed out twice
    with pytest.raises(ValueError):
        bm.append(2, 1)  # beyond its cap
    bm.free(2)
    assert bm.free_blocks == 8
    bm.free(1)
    assert bm.free_blocks == 10 and bm.seq_ids() == []


def test_truncate_frees_whole_blocks_only() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.add(0, max_length=32)
    bm.append(0, 13)  # 4 blocks
    table = list(bm.block_table(0))
    bm.truncate(0, 9)  # still needs 3 blocks: the partly stale 3rd block is kept
    assert bm.block_table(0) == table[:3] and bm.length(0) == 9 and bm.free_blocks == 5
    bm.truncate(0, 8)  # exactly 2 blocks
    assert bm.block_table(0) == table[:2] and bm.free_blocks == 6
    bm.truncate(0, 8)  # no-op
    assert bm.free_blocks == 6
    # freed blocks are free for anyone: nothing is held back for the sequence
    bm.add(1, max_length=8)
    bm.append(1, 8)
    assert bm.free_blocks == 4 and not bm.room_for({0: 32})
    bm.free(1)
    bm.append(0, 24)  # grows back to its full max_length
    assert bm.length(0) == 32 and bm.free_blocks == 0
    with pytest.raises(ValueError):
        bm.truncate(0, 33)
    with pytest.raises(ValueError):
        bm.truncate(0, -1)
    bm.truncate(0, 0)
    assert bm.block_table(0) == [] and bm.free_blocks == 8
    bm.free(0)


def test_room_for_and_running_dry() -> None:
    bm = BlockManager(num_blocks=4, block_size=16)
    assert bm.room_for({0: 64}) and not bm.room_for({0: 65})
    bm.add(0, 48)
    bm.append(0, 33)  # 3 blocks
    assert bm.blocks_to_grow(0, 48) == 0 and bm.blocks_to_grow(0, 49) == 1 and bm.blocks_to_grow(7, 17) == 2
    assert bm.room_for({0: 48, 1: 16}) and not bm.room_for({1: 17})
    assert not bm.room_for({0: 49})  # past its cap, whatever is free
    bm.add(1, 64)
    with pytest.raises(CapacityError):
        bm.append(1, 17)
    assert bm.length(1) == 0 and bm.free_blocks == 1  # a failed append takes nothing
    with pytest.raises(ValueError):
        bm.add(0, 1)  # duplicate id
    with pytest.raises(ValueError):
        bm.add(2, 0)
    with pytest.raises(ValueError):
        bm.append(5, 1)
    bm.free(0)
    with pytest.raises(ValueError):
        bm.free(0)
    assert bm.room_for({1: 64})
    with pytest.raises(ConfigError):
        BlockManager(0, 16)


def test_pool_sizing_from_budget() -> None:
    geo = {"num_layers": 2, "block_size": 16, "num_kv_heads": 2, "head_dim": 16}
    per_block = KVCache.bytes_per_block(**geo, dtype=torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 16 * 4
    assert KVCache.num_blocks_for_budget(1.0, **geo, dtype=torch.float32) == 2**20 // per_block
    assert KVCache.num_blocks_for_budget(1.0, **geo, dtype=torch.bfloat16) == 2**20 // (per_block // 2)


# -- Rollback through the engine -------------------------------------------------------------------


def _fresh_logits(eng: TorchEngine, toks: list[int]) -> torch.Tensor:
    """All-position logits of ``toks`` prefetched from scratch in a scratch sequence."""
    eng.add_sequence(-1, len(toks))
    try:
        return eng.forward([ForwardInput(-1, toks, len(toks))])[0]
    finally:
        eng.free(-1)


def _assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("block_size", [4, 16])
def test_random_accept_reject_histories_match_fresh_prefill(block_size: int) -> None:
    rng = random.Random(1234)
    eng = TorchEngine.from_random(ARGS, seed=7, num_blocks=200, block_size=block_size)
    ref = TorchEngine.from_random(ARGS, seed=7, num_blocks=64, block_size=16)
    full = eng.kv_usage().free_blocks
    seqs = {sid: [rng.randrange(ARGS.vocab_size) for _ in range(rng.randint(1, 20))] for sid in range(4)}
    for sid in seqs:
        eng.add_sequence(sid, 160)
    # Ragged prefill of all prompts in one call.
    out = eng.forward([ForwardInput(sid, toks, 1) for sid, toks in seqs.items()])
    for (_sid, toks), logits in zip(seqs.items(), out, strict=True):
        _assert_close(logits, _fresh_logits(ref, toks)[-1:])

    for _step in range(12):
        # A random subset of sequences verifies k drafts (+1 bonus token) in one batched forward.
        active = [sid for sid in seqs if rng.random() < 0.8] or [0]
        drafts = {
            sid: [rng.randrange(ARGS.vocab_size) for _ in range(rng.randint(0, 5) + 1)] for sid in active
        }
        out = eng.forward([ForwardInput(sid, drafts[sid], len(drafts[sid])) for sid in active])
        for sid, logits in zip(active, out, strict=True):
            # Logits of the new tokens equal a fresh prefill of accepted history + new tokens.
            expect = _fresh_logits(ref, seqs[sid] + drafts[sid])[len(seqs[sid]) :]
            _assert_close(logits, expect)
            # Accept a random prefix; the rest is rolled back (and later overwritten).
            accepted = rng.randint(0, len(drafts[sid]))
            seqs[sid] = seqs[sid] + drafts[sid][:accepted]
            eng.truncate(sid, len(seqs[sid]))
            assert eng.cached_length(sid) == len(seqs[sid])
            used_by_sid = blocks_for(len(seqs[sid]), block_size)
            assert len(eng.blocks.block_table(sid)) == used_by_sid
        assert eng.kv_usage().used_blocks == sum(blocks_for(len(t), block_size) for t in seqs.values())

    # After all the churn: next-token logits from the cache == fresh prefill of the accepted tokens.
    probe = {sid: rng.randrange(ARGS.vocab_size) for sid in seqs}
    out = eng.forward([ForwardInput(sid, [tok], 1) for sid, tok in probe.items()])
    for (sid, tok), logits in zip(probe.items(), out, strict=True):
        _assert_close(logits, _fresh_logits(ref, [*seqs[sid], tok])[-1:])

    for sid in seqs:
        eng.free(sid)
    assert eng.kv_usage().free_blocks == full
    assert eng.kv_usage().used_blocks == 0


def test_rollback_to_zero_and_reuse_of_freed_blocks() -> None:
    eng = TorchEngine.from_random(ARGS, seed=3, num_blocks=6, block_size=4)
    eng.add_sequence(0, 24)
    a = list(range(1, 20))
    first = eng.forward([ForwardInput(0, a, 1)])[0]
    eng.truncate(0, 0)
    assert eng.kv_usage().used_blocks == 0
    b = list(range(100, 110))
    got = eng.forward([ForwardInput(0, b, 1)])[0]
    # Blocks that held ``a`` now hold ``b``: nothing of ``a`` may leak into the logits.
    ref = TorchEngine.from_random(ARGS, seed=3, num_blocks=6, block_size=4)
    ref.add_sequence(0, 24)
    _assert_close(got, ref.forward([ForwardInput(0, b, 1)])[0])
    assert not torch.allclose(first, got)
