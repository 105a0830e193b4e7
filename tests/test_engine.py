"""TorchEngine: ragged batching == one sequence at a time, num_logits, errors, dtypes."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_args
from trispec.engine.args import ModelArgs
from trispec.engine.base import Engine, ForwardInput
from trispec.engine.torch_engine import TorchEngine
from trispec.errors import CapacityError, ConfigError

ARGS = tiny_args("qwen2", 320, num_layers=3, tie_embeddings=True, max_position_embeddings=512)
LLAMA = tiny_args(
    "llama", 256, intermediate_size=160, rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=512
)


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    assert a.shape == b.shape
    err = ((a - b).abs().max() / b.abs().max()).item()
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e}"


def tokens(n: int, seed: int, vocab: int = ARGS.vocab_size) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_protocol_and_properties() -> None:
    eng = TorchEngine.from_random(ARGS, seed=0, num_blocks=8, block_size=16)
    assert isinstance(eng, Engine)
    assert eng.vocab_size == ARGS.vocab_size
    assert eng.max_context == 8 * 16  # min(max_position_embeddings, pool capacity)
    assert eng.args == ARGS
    usage = eng.kv_usage()
    assert (usage.total_blocks, usage.used_blocks, usage.block_size) == (8, 0, 16)
    big = TorchEngine.from_random(ARGS, seed=0, num_blocks=100)
    assert big.max_context == ARGS.max_position_embeddings


@pytest.mark.parametrize("args", [ARGS, LLAMA], ids=["qwen2", "llama"])
def test_ragged_batch_equals_each_sequence_alone(args: ModelArgs) -> None:
    batched = TorchEngine.from_random(args, seed=1, num_blocks=64, block_size=8)
    alone = TorchEngine.from_random(args, seed=1, num_blocks=64, block_size=8)
    prompts = {
        10: tokens(13, 1, args.vocab_size),
        11: tokens(1, 2, args.vocab_size),
        12: tokens(29, 3, args.vocab_size),
    }
    for sid in prompts:
        batched.add_sequence(sid, 100)
        alone.add_sequence(sid, 100)
    # Steps mix prefill, multi-token (verify-like) and single-token inputs in one call.
    steps = [
        {10: (prompts[10], 2), 11: (prompts[11], 1), 12: (prompts[12], 29)},
        {
            10: (tokens(3, 4, args.vocab_size), 3),
            11: (tokens(1, 5, args.vocab_size), 1),
            12: (tokens(5, 6, args.vocab_size), 5),
        },
        {
            12: (tokens(1, 7, args.vocab_size), 1),
            10: (tokens(6, 8, args.vocab_size), 0),
            11: (tokens(1, 9, args.vocab_size), 1),
        },
        {11: (tokens(4, 10, args.vocab_size), 2), 10: (tokens(1, 11, args.vocab_size), 1)},
    ]
    for step in steps:
        inputs = [ForwardInput(sid, toks, k) for sid, (toks, k) in step.items()]
        out = batched.forward(inputs)
        assert len(out) == len(inputs)
        for inp, logits in zip(inputs, out, strict=True):
            ref = alone.forward([inp])[0]
            assert logits.dtype == torch.float32
            assert logits.shape == (inp.num_logits, args.vocab_size)
            if inp.num_logits:
                close(logits, ref)
            assert batched.cached_length(inp.seq_id) == alone.cached_length(inp.seq_id)


def test_num_logits_are_the_last_rows() -> None:
    eng = TorchEngine.from_random(ARGS, seed=2, num_blocks=32)
    toks = tokens(20, 3)
    eng.add_sequence(0, 64)
    full = eng.forward([ForwardInput(0, toks, 20)])[0]
    assert full.shape == (20, ARGS.vocab_size)
    for k in (0, 1, 4):
        eng.truncate(0, 0)
        out = eng.forward([ForwardInput(0, toks, k)])[0]
        assert out.shape == (k, ARGS.vocab_size)
        if k:
            close(out, full[-k:])
    # Zero new tokens is a no-op that still returns an empty [0, vocab] tensor.
    assert eng.forward([ForwardInput(0, [], 0)])[0].shape == (0, ARGS.vocab_size)
    assert eng.cached_length(0) == 20
    assert eng.forward([]) == []
    # An empty input next to real ones in the same batch.
    eng.add_sequence(1, 64)
    out = eng.forward([ForwardInput(0, toks[:3], 2)])
    eng.truncate(0, 20)
    mixed = eng.forward([ForwardInput(1, [], 0), ForwardInput(0, toks[:3], 2)])
    assert mixed[0].shape == (0, ARGS.vocab_size)
    close(mixed[1], out[0])
    assert (eng.cached_length(0), eng.cached_length(1)) == (23, 0)


def test_deterministic_random_init() -> None:
    toks = tokens(9, 4)
    outs = []
    for seed in (5, 5, 6):
        eng = TorchEngine.from_random(ARGS, seed=seed, num_blocks=8)
        eng.add_sequence(0, 16)
        outs.append(eng.forward([ForwardInput(0, toks, 9)])[0])
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])
    # Not degenerate: greedy picks vary across positions and the logits are not flat.
    assert len(set(outs[0].argmax(-1).tolist())) > 3
    assert outs[0].std(-1).min() > 0.1


def test_errors_leave_state_untouched() -> None:
    eng = TorchEngine.from_random(ARGS, seed=0, num_blocks=4, block_size=16)
    eng.add_sequence(1, 20)
    eng.forward([ForwardInput(1, tokens(5, 0), 1)])
    before = (eng.cached_length(1), eng.kv_usage())
    bad = [
        [ForwardInput(99, [1], 1)],  # unknown seq
        [ForwardInput(1, tokens(16, 1), 1)],  # 5 + 16 > its cap of 20
        [ForwardInput(1, [1, 2], 3)],  # num_logits > new tokens
        [ForwardInput(1, [1], -1)],
        [ForwardInput(1, [ARGS.vocab_size], 1)],  # token id out of range
        [ForwardInput(1, [-1], 1)],
        [ForwardInput(1, [1], 1), ForwardInput(1, [2], 1)],  # same seq twice
        [ForwardInput(1, [1], 1), ForwardInput(7, [2], 1)],  # one bad input fails the whole call
    ]
    for inputs in bad:
        with pytest.raises(ValueError):
            eng.forward(inputs)
        assert (eng.cached_length(1), eng.kv_usage()) == before
    with pytest.raises(ValueError):
        eng.add_sequence(1, 10)  # already registered
    with pytest.raises(ValueError):
        eng.add_sequence(2, eng.max_context + 1)
    with pytest.raises(ValueError):
        eng.add_sequence(2, 0)
    with pytest.raises(ValueError):
        eng.truncate(1, 6)  # longer than cached
    with pytest.raises(ValueError):
        eng.cached_length(42)
    with pytest.raises(ValueError):
        eng.free(42)
    # Pool: 4 blocks of 16, taken as tokens arrive; seq 1 holds one (5 tokens) -> 48 more fit, 49 do not.
    assert eng.room_for({2: 48}) and not eng.room_for({2: 49})
    assert eng.room_for({1: 16, 2: 48}) and not eng.room_for({1: 17, 2: 48})
    assert not eng.room_for({1: 21})  # past its own cap
    eng.add_sequence(2, 64)  # registering takes no block
    assert eng.kv_usage().used_blocks == 1
    with pytest.raises(CapacityError):  # the scheduler asks room_for first; running dry is an error
        eng.forward([ForwardInput(2, tokens(49, 2), 1)])
    assert (eng.cached_length(1), eng.cached_length(2), eng.kv_usage().used_blocks) == (5, 0, 1)
    eng.forward([ForwardInput(2, tokens(48, 2), 1)])
    assert not eng.room_for({1: 17})
    eng.free(1)
    eng.free(2)
    assert eng.kv_usage().used_blocks == 0 and eng.room_for({3: 64})


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        TorchEngine.from_random(ARGS, seed=0, num_blocks=4, max_context=65)
    with pytest.raises(ConfigError):
        TorchEngine.from_random(ARGS, seed=0, dtype="float16")
    with pytest.raises(ConfigError):
        TorchEngine.from_random(ARGS, seed=0, weight_quant="int4")
    with pytest.raises(ConfigError):
        TorchEngine.from_random(ARGS, seed=0, kv_cache_mb=0.0001)
    with pytest.raises(ConfigError, match="device"):
        TorchEngine.from_random(ARGS, seed=0, device="xla")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            TorchEngine.from_random(ARGS, seed=0, device="cuda")
    from trispec.engine.build import build_transformer

    with pytest.raises(ConfigError, match="int8 weight-only runs on CPU"):  # checked before any weight
        build_transformer(ARGS, {}, weight_quant="int8", device=torch.device("meta"))
    # kv_cache_mb sizes the pool: 2 (k, v) * 3 layers * 16 tokens * 2 heads * 16 dims * 4 bytes.
    eng = TorchEngine.from_random(ARGS, seed=0, kv_cache_mb=1.0)
    assert eng.kv_usage().total_blocks == 2**20 // (2 * 3 * 16 * 2 * 16 * 4)


@pytest.mark.parametrize(("dtype", "quant"), [("bfloat16", None), (None, "int8"), ("float32", "int8")])
def test_low_precision_variants_track_fp32(dtype: str | None, quant: str | None) -> None:
    toks = tokens(24, 9, LLAMA.vocab_size)
    ref_eng = TorchEngine.from_random(LLAMA, seed=3, num_blocks=8)
    eng = TorchEngine.from_random(LLAMA, seed=3, num_blocks=8, dtype=dtype, weight_quant=quant)
    if quant == "int8" and dtype is None:
        assert eng.dtype == torch.bfloat16  # int8 kernel is fast with bf16 activations
    outs = []
    for e in (ref_eng, eng):
        e.add_sequence(0, 32)
        a = e.forward([ForwardInput(0, toks[:20], 20)])[0]
        b = e.forward([ForwardInput(0, toks[20:], 2)])[0]
        outs.append(torch.cat([a, b]))
    ref, low = outs
    assert low.dtype == torch.float32
    err = ((low - ref).abs().max() / ref.abs().max()).item()
    assert err < 0.1, err
    agree = (low.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.8, agree


def test_import_kv_continues_as_if_the_engine_had_computed_the_tokens() -> None:
    """An engine that takes another's keys and values for a prefix (same weights) gives the next
    token the same logits as the engine that computed them; lengths, blocks and errors as expected."""
    prompt = list(range(5, 45))
    source = TorchEngine.from_random(tiny_args(), 0, num_blocks=32, block_size=8)
    source.add_sequence(1, 60)
    source.forward([ForwardInput(1, prompt, 0)])
    expected = source.forward([ForwardInput(1, [7], 1)])[0]
    source.truncate(1, len(prompt))

    copy = TorchEngine.from_random(tiny_args(), 0, num_blocks=32, block_size=4)  # other blocks
    copy.add_sequence(3, 60)  # another sequence first, so the slots differ from the source's
    copy.forward([ForwardInput(3, [1, 2, 3, 4, 5], 0)])
    copy.add_sequence(1, 60)
    copy.forward([ForwardInput(1, prompt[:9], 0)])  # its own keys for a first part
    copy.import_kv(1, source, len(prompt))
    assert copy.cached_length(1) == len(prompt)
    assert torch.equal(copy.forward([ForwardInput(1, [7], 1)])[0], expected)
    copy.import_kv(1, source, 10)  # already held: nothing to do
    assert copy.cached_length(1) == len(prompt) + 1

    with pytest.raises(ValueError, match="holds 40 tokens"):
        copy.import_kv(1, source, 45)
    narrow = TorchEngine.from_random(tiny_args(num_kv_heads=1), 0, num_blocks=8, block_size=8)
    assert not narrow.same_kv_geometry(source) and copy.same_kv_geometry(source)


@pytest.mark.parametrize("args", [ARGS, LLAMA], ids=["qwen2-tied", "llama"])
def test_streamed_bytes_are_the_linear_layers(args: ModelArgs) -> None:
    # what a 1-token step reads (the bench's GB/s figure): every matmul weight once, the LM head
    # included even when tied (its packed copy is what the step reads); not the embedding table
    model = TorchEngine.from_random(args, seed=0, num_blocks=8).model
    hidden, inter = args.hidden_size, args.intermediate_size
    qkv_out = args.q_size + 2 * args.kv_size
    per_layer = qkv_out * hidden + hidden * args.q_size + 2 * inter * hidden + hidden * inter
    biases = qkv_out if args.arch == "qwen2" or args.attention_bias else 0
    expected = 4 * (args.num_layers * (per_layer + biases) + args.vocab_size * hidden)
    assert model.streamed_bytes == expected
    table_and_norm = 4 * (args.vocab_size * hidden + hidden)
    assert model.weight_bytes == expected + table_and_norm
