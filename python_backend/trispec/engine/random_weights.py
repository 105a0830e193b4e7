"""Random weights of a model's real shapes, for tests and benchmarks: what each tensor is (name,
shape, scale), drawn on the host in one sequence (``random_state_dict``, fp32) or on a GPU
tensor by tensor (``device_state_dict``): a 7B model's weights drawn directly in bf16 where they will
run take seconds, where an fp32 build on the host took minutes and 30 GB.

Scales: HF's init (normal, std 0.02) makes a tiny model's logits nearly flat and greedy decoding a
constant token. Here projections are 1/sqrt(fan_in)-scaled, and the residual writers (o, down) get
gain 2 over a 0.3-std embedding so that the layers, not the current token's own embedding, dominate
the final hidden state: with tied embeddings the latter makes greedy repeat the input.
"""

from __future__ import annotations

import functools

import torch

from trispec.engine.args import ModelArgs
from trispec.engine.weights import LazyStateDict

# (HF name, shape, std, mean) in the order the host draws them
Spec = tuple[str, tuple[int, ...], float, float]


def random_specs(args: ModelArgs) -> list[Spec]:
    h, inter, d = args.hidden_size, args.intermediate_size, args.head_dim
    specs: list[Spec] = [("model.embed_tokens.weight", (args.vocab_size, h), 0.3, 0.0)]
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (h,), 0.1, 1.0),
            (p + "post_attention_layernorm.weight", (h,), 0.1, 1.0),
            (p + "self_attn.q_proj.weight", (args.num_heads * d, h), h**-0.5, 0.0),
            (p + "self_attn.k_proj.weight", (args.num_kv_heads * d, h), h**-0.5, 0.0),
            (p + "self_attn.v_proj.weight", (args.num_kv_heads * d, h), h**-0.5, 0.0),
            (p + "self_attn.o_proj.weight", (h, args.num_heads * d), 2 * (args.num_heads * d) ** -0.5, 0.0),
        ]
        if args.attention_bias:
            for n, size in (("q", args.q_size), ("k", args.kv_size), ("v", args.kv_size)):
                specs.append((p + f"self_attn.{n}_proj.bias", (size,), 0.02, 0.0))
        if args.o_bias:
            specs.append((p + "self_attn.o_proj.bias", (h,), 0.02, 0.0))
        specs += [
            (p + "mlp.gate_proj.weight", (inter, h), h**-0.5, 0.0),
            (p + "mlp.up_proj.weight", (inter, h), h**-0.5, 0.0),
            (p + "mlp.down_proj.weight", (h, inter), 2 * inter**-0.5, 0.0),
        ]
    specs.append(("model.norm.weight", (h,), 0.1, 1.0))
    if not args.tie_embeddings:
        specs.append(("lm_head.weight", (args.vocab_size, h), h**-0.5, 0.0))
    return specs


def device_state_dict(
    args: ModelArgs, seed: int, device: torch.device, dtype: torch.dtype = torch.bfloat16
) -> LazyStateDict:
    """Each tensor drawn on ``device`` in ``dtype`` when the build asks for it (its own generator,
    seeded from ``seed`` and its index: the same weights every time on the same kind of device)."""
    loaders = {
        name: functools.partial(_draw, shape, std, mean, seed * 100_003 + i, device, dtype)
        for i, (name, shape, std, mean) in enumerate(random_specs(args))
    }
    return LazyStateDict(loaders)


def _draw(
    shape: tuple[int, ...], std: float, mean: float, seed: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    t = torch.randn(shape, generator=g, device=device, dtype=dtype).mul_(std)
    return t.add_(mean) if mean else t


def random_state_dict(args: ModelArgs, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random HF-named weights (fp32, drawn on the host in one sequence); the shapes
    and scales are ``random_specs``'s (``device_state_dict`` draws on a GPU)."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for name, shape, std, mean in random_specs(args):
        t = torch.randn(*shape, generator=g) * std
        sd[name] = mean + t if mean else t
    return sd
