"""Weights built for a GPU without a host float32 pass: random weights drawn tensor by tensor where
they run, in their dtype; real ones moved as stored and widened there. The GPU itself is stood in
for by the CPU (the draws) and by the meta device (where the build reads each tensor from)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tiny import tiny_args
from trispec.engine.build import build_transformer
from trispec.engine.random_weights import device_state_dict, random_state_dict
from trispec.engine.weights import LazyStateDict, load_safetensors_dir


def test_device_draws_have_the_host_names_shapes_and_scales_lazily() -> None:
    args = tiny_args("qwen2", hidden_size=128)
    host = random_state_dict(args, 0)
    drawn = device_state_dict(args, 0, torch.device("cpu"), torch.bfloat16)
    assert list(drawn) == list(host)
    for name, tensor in host.items():
        t = drawn[name]
        assert t.shape == tensor.shape and t.dtype == torch.bfloat16
        assert abs(t.float().std() - tensor.std()) < 0.2 * tensor.std() + 0.01
        assert abs(t.float().mean() - tensor.mean()) < 0.05
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(drawn[name], drawn[name])  # each read draws the same tensor again
    other = device_state_dict(args, 1, torch.device("cpu"), torch.bfloat16)
    assert not torch.equal(other[name], drawn[name])


def test_a_gpu_build_reads_each_tensor_as_stored_never_as_host_float32() -> None:
    args = tiny_args("qwen2")
    weights = device_state_dict(args, 0, torch.device("cpu"), torch.bfloat16)

    def host_float32() -> torch.Tensor:
        raise AssertionError("a tensor was widened to float32 on the host")

    lazy = LazyStateDict(
        {n: host_float32 for n in weights}, stored_loaders={n: (lambda n=n: weights[n]) for n in weights}
    )
    model = build_transformer(args, lazy, dtype=torch.bfloat16, device=torch.device("meta"))
    assert model.layers[0].qkv.weight.device.type == "meta"  # type: ignore[attr-defined]
    assert model.lm_head.weight.dtype == torch.bfloat16  # type: ignore[attr-defined]


def test_safetensors_keep_their_stored_dtype_and_membership_reads_nothing(tmp_path: Path) -> None:
    args = tiny_args("llama")
    state = {n: t.to(torch.bfloat16) for n, t in random_state_dict(args, 2).items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "max_position_embeddings": 1024,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    _, sd = load_safetensors_dir(tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"
    assert sd.stored(name).dtype == torch.bfloat16 and sd[name].dtype == torch.float32
    assert torch.equal(sd.stored(name).float(), sd[name])
    sd._loaders[name] = lambda: (_ for _ in ()).throw(AssertionError("read"))  # type: ignore[assignment]
    assert name in sd and "lm_head.bias" not in sd
