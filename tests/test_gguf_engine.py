"""``weights: gguf`` through the engine: a GGUF file's own blocks hold its dense float32 load's values;
layers on the integer path (int8 activations, ``test_gguf_q8.py``) track the float32 model within the
stated tolerance, the others compute its values in another summation order; a fraction of the memory,
and exact speculative decoding still holds on it.

Files are tiny random models written with gguf-py (``gguf_files``), every linear layer in one of the
legacy types (q, k and v of a layer in three different ones); llama files have their q/k rows
permuted as llama.cpp stores them, so the loader's un-permuting of blocks is covered too.
"""

from __future__ import annotations

import pytest
import torch
from gguf_files import T, mixed_legacy, random_gguf, write_gguf
from tiny import reference_greedy, run_to_completion, spec_engine, tiny_args, tokens_of
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.cpu.linear import DenseLinear, GGUFLinear, gguf_rows
from trispec.engine.random_weights import random_state_dict
from trispec.engine.torch_engine import TorchEngine
from trispec.engine.weights import load_checkpoint
from trispec.errors import ConfigError
from trispec.request import GenerationRequest

ARCHS = {"llama": tiny_args("llama"), "qwen2-tied": tiny_args("qwen2", tie_embeddings=True)}


def gguf_engine(path, **kw: object) -> TorchEngine:
    kw.setdefault("num_blocks", 256)
    kw.setdefault("block_size", 8)
    return TorchEngine.from_checkpoint(path, weight_quant="gguf", **kw)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_blocks_hold_exactly_the_dense_loaders_values(arch: str) -> None:
    """Every 2-D tensor's blocks (llama q/k un-permuted row by row) decode to the float32 the dense
    path loads, bit for bit."""
    _, state_dict = load_checkpoint(random_gguf(ARCHS[arch], 0))
    checked = 0
    for name in state_dict:
        blocks = state_dict.blocks(name)
        if blocks is None:
            continue
        dense = state_dict[name]
        assert blocks.rows == dense.shape[0] and blocks.columns == dense.shape[1]
        if blocks.ggml_type != int(T.F32):
            assert torch.equal(gguf_rows(blocks, torch.arange(blocks.rows)), dense), name
            checked += 1
    assert checked >= 7 * ARCHS[arch].num_layers


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_track_the_dense_load_of_the_same_file(arch: str) -> None:
    path = random_gguf(ARCHS[arch], 0)
    dense = TorchEngine.from_checkpoint(path, num_blocks=64, block_size=8)
    blocks = gguf_engine(path)
    assert all(isinstance(m, GGUFLinear) for m in blocks.model.linears())
    assert blocks.model.weight_bytes * 3 < dense.model.weight_bytes
    ids = torch.randint(0, 320, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    out = []
    for engine in (dense, blocks):
        engine.add_sequence(0, 64)
        out.append(torch.cat([engine.forward([ForwardInput(0, ids[:20], 20)])[0],
                              engine.forward([ForwardInput(0, ids[20:], 10)])[0]]))  # fmt: skip
    # int8 activations (docs/determinism.md): within 5 % of the largest logit, 3 % on average
    difference = (out[0] - out[1]).abs()
    assert float(difference.max()) <= 0.05 * float(out[0].abs().max())
    assert float(difference.mean()) <= 0.03 * float(out[0].abs().mean())
    assert float((out[0].argmax(-1) == out[1].argmax(-1)).float().mean()) >= 0.9


def greedy(engine: TorchEngine, prompt: list[int], n: int) -> list[int]:
    engine.add_sequence(99, len(prompt) + n)
    logits = engine.forward([ForwardInput(99, prompt, 1)])[0]
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = engine.forward([ForwardInput(99, out[-1:], 1)])[0]
    engine.free(99)
    return out


@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculation_on_a_gguf_target_equals_its_own_plain_decoding(k: int) -> None:
    path = random_gguf(ARCHS["llama"], 0)
    prompts = [[(7 * i + 3 * j) % 256 for j in range(5 + 3 * i)] for i in range(10)]
    expected = [greedy(gguf_engine(path), p, 24) for p in prompts]
    assert len({tuple(e) for e in expected}) > 5  # not a degenerate model
    drafters = {
        "the same file dense": ModelDrafter(TorchEngine.from_checkpoint(path, num_blocks=256, block_size=8)),
        "another model": ModelDrafter(
            TorchEngine.from_random(ARCHS["llama"], 5, num_blocks=256, block_size=8)
        ),
    }
    for name, drafter in drafters.items():
        llm = spec_engine(gguf_engine(path), drafter)
        ids = [
            llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=24, num_draft_tokens=k))
            for p in prompts
        ]
        outputs = run_to_completion(llm)
        assert [tokens_of(outputs[i]) for i in ids] == expected, name


def test_greedy_speculation_on_an_integer_path_target_equals_its_own_plain_decoding() -> None:
    """K-quants everywhere (Q4_K_M's mix): every layer on the integer path, drafted by its own float32
    load; k = 4."""
    args = tiny_args(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64)
    path = random_gguf(args, 0, mix="k")
    target = gguf_engine(path)
    assert all(isinstance(m, GGUFLinear) and m.integer for m in target.model.linears())
    prompts = [[(5 * i + 7 * j) % 256 for j in range(4 + 2 * i)] for i in range(8)]
    expected = [greedy(target, p, 16) for p in prompts]
    assert len({tuple(e) for e in expected}) > 4
    drafter = ModelDrafter(TorchEngine.from_checkpoint(path, num_blocks=256, block_size=8))
    llm = spec_engine(gguf_engine(path), drafter)
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=16, num_draft_tokens=4))
        for p in prompts
    ]
    outputs = run_to_completion(llm)
    assert [tokens_of(outputs[i]) for i in ids] == expected


def test_a_type_the_kernel_does_not_decode_falls_back_to_dense(tmp_path) -> None:
    """F32 matrices (and any other type the kernel lacks) are built dense, norm folded in, beside
    block layers; the logits still track the all-dense engine."""
    args = ARCHS["llama"]
    path = tmp_path / "partly.gguf"
    write_gguf(
        path, args, random_state_dict(args, 3), types=lambda n: None if "mlp." in n else mixed_legacy(n)
    )
    blocks = gguf_engine(path)
    layer = blocks.model.layers[0]
    assert isinstance(layer.qkv, GGUFLinear) and layer.attn_norm is not None
    assert isinstance(layer.gate_up, DenseLinear) and layer.mlp_norm is None
    dense = TorchEngine.from_checkpoint(path, num_blocks=64, block_size=8)
    assert greedy(blocks, [1, 2, 3, 4], 12) == greedy(dense, [1, 2, 3, 4], 12)


def test_gguf_weights_are_refused_where_they_cannot_run() -> None:
    args = ARCHS["llama"]
    with pytest.raises(ConfigError, match="gguf checkpoint"):
        TorchEngine.from_random(args, 0, num_blocks=8, weight_quant="gguf")
    with pytest.raises(ConfigError, match="float32"):
        gguf_engine(random_gguf(args, 0), dtype="bfloat16")


def test_the_reference_is_the_dense_tiny_model() -> None:
    """Sanity of the helpers above: the dense load of an F32 file is the random model itself."""
    args = tiny_args()
    path = random_gguf(args, 0, mix="f32")
    assert greedy(
        TorchEngine.from_checkpoint(path, num_blocks=64, block_size=8), [5, 6, 7], 10
    ) == reference_greedy([5, 6, 7], 10)
