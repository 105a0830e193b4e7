"""What scripts/gpu_spec_bench.py measures, decided before it starts: the model shapes, every point of
every section, the KV each model needs for its largest point (the first H100 run crashed at 0.5B,
batch 32, context 2048 when the small models got a quarter of the budget), and the device memory of
it all against what the device has. Importable without a device (``scripts/triton_aot.py`` takes the
bench's ``GraphRound`` shapes from here, so CI compiles exactly what the GPU run launches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Qwen2.5 shapes (scripts/cuda_step_costs.py); one vocabulary for all three (the 0.5B and 1.5B
# files say 151936, the 7B 152064: a random target could emit an id its draft cannot embed)
QWEN = {
    "0.5b": dict(vocab_size=152064, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, head_dim=64, tie_embeddings=True),
    "1.5b": dict(vocab_size=152064, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                 num_kv_heads=2, head_dim=128, tie_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
               num_kv_heads=4, head_dim=128, tie_embeddings=False),
}  # fmt: skip
TINY = {  # the same GQA ratios (7, 6, 7), two layers
    "0.5b": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=14,
                 num_kv_heads=2, head_dim=16, tie_embeddings=True),
    "1.5b": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=12,
                 num_kv_heads=2, head_dim=16, tie_embeddings=True),
    "7b": dict(vocab_size=320, hidden_size=96, intermediate_size=192, num_layers=2, num_heads=28,
               num_kv_heads=4, head_dim=16, tie_embeddings=False),
}  # fmt: skip
BLOCK_SIZE = 16  # TorchEngine's default, as served
SCHEDULER_K = 3  # the scheduler section's drafts per round
SELF_DRAFT_K = 4
KERNEL_CASES = ((14, 2, 1), (14, 2, 5), (12, 2, 5))  # heads, KV heads, rows: the kernel check's cases
KERNEL_TIME_HEADS = (28, 4)


def model_args(name: str, tiny: bool, max_context: int) -> Any:
    from trispec.engine.args import ModelArgs

    shape = (TINY if tiny else QWEN)[name]
    return ModelArgs(arch="qwen2", rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True,
                     max_position_embeddings=max(4096, max_context), **shape)  # fmt: skip


@dataclass(frozen=True)
class Points:
    """Every point of the run."""

    tiny: bool
    tokens: int  # per generation at batch 1 (half, at least 8, at larger batches)
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    sizes: tuple[int, ...]  # graph sizes; plain decoding also runs past the largest (in parts)
    plain_batches: tuple[int, ...]
    ks: tuple[int, ...]  # k = 5 at batch 1 only (issue 33's target: a = 0.8, k = 5)
    accepts: tuple[float, ...]
    prompt: int

    @classmethod
    def of(cls, tiny: bool, tokens: int = 256) -> Points:
        if tiny:  # each code path once
            return cls(True, 24, (1, 2), (40,), (1, 2, 4), (1, 2, 8), (3,), (0.7,), 16)
        return cls(False, tokens, (1, 8, 32), (512, 2048), (1, 8, 32, 256), (1, 8, 32, 256), (3, 4, 5),
                   (0.6, 0.7, 0.8, 0.9), 64)  # fmt: skip

    def tokens_for(self, batch: int) -> int:
        return self.tokens if batch == 1 else max(self.tokens // 2, 8)

    @property
    def max_context(self) -> int:
        return max(self.contexts) + 2 * self.tokens + 128

    def ks_at(self, batch: int) -> tuple[int, ...]:
        return self.ks if batch == 1 else self.ks[:2]


def _seqs(batch: int, tokens: int) -> int:
    """KV tokens of ``batch`` sequences of ``tokens`` each, every one rounded up to whole blocks plus
    one (the rows a verify reserves past its length)."""
    return batch * (-(-tokens // BLOCK_SIZE) + 1) * BLOCK_SIZE


def kv_tokens(p: Points) -> dict[str, int]:
    """Per model: the KV tokens of its largest point. Sections run one after another and free their
    sequences, so a model needs the most any one section holds at once."""
    k = max(p.ks)
    steps = max(_seqs(b, c + 5) for b in p.batches for c in p.contexts)  # step costs, every model
    generation = max(
        max(_seqs(b, p.prompt + p.tokens_for(b) + 2) for b in p.plain_batches),  # plain (7B)
        max(_seqs(b, p.prompt + p.tokens_for(b) + k + 2) for b in p.batches),  # spec (7B, 0.5B)
        _seqs(max(p.batches), p.prompt + p.tokens + SCHEDULER_K + 2),  # the scheduler's slots
    )
    return {"0.5b": max(steps, generation), "1.5b": steps, "7b": max(steps, generation)}


def self_draft_tokens(p: Points) -> int:
    """The 7B as its own draft (batch 1): a KV pool of its own, this size (its whole context: the same
    block-table width as the other engines, so the same compiled kernels)."""
    return max(_seqs(1, p.prompt + p.tokens + SELF_DRAFT_K + 2), p.max_context)


def kv_bytes_per_token(name: str, tiny: bool, dtype_bytes: int) -> int:
    a = (TINY if tiny else QWEN)[name]
    return 2 * a["num_layers"] * a["num_kv_heads"] * a["head_dim"] * dtype_bytes


def weight_bytes(name: str, tiny: bool, dtype_bytes: int) -> int:
    a = (TINY if tiny else QWEN)[name]
    h, inter, v = a["hidden_size"], a["intermediate_size"], a["vocab_size"]
    q, kv = a["num_heads"] * a["head_dim"], a["num_kv_heads"] * a["head_dim"]
    layer = h * (q + 2 * kv) + (q + 2 * kv) + q * h + 3 * h * inter + 2 * h
    return dtype_bytes * (a["num_layers"] * layer + v * h * (1 if a["tie_embeddings"] else 2) + h)


def memory_plan(p: Points, dtype_bytes: int, vocab_rows: int = 0) -> dict[str, Any]:
    """Device bytes of everything the run holds at its peak: every model's weights and KV, the
    self-draft's pool, the largest verify graph's logits (all sampler modes' float32 copies) and a
    GiB of slack; ``kv_mb`` per model for ``TorchEngine``."""
    tokens = kv_tokens(p)
    kv = {n: tokens[n] * kv_bytes_per_token(n, p.tiny, dtype_bytes) for n in QWEN}
    weights = {n: weight_bytes(n, p.tiny, dtype_bytes) for n in QWEN}
    self_kv = self_draft_tokens(p) * kv_bytes_per_token("7b", p.tiny, dtype_bytes)
    vocab = (TINY if p.tiny else QWEN)["7b"]["vocab_size"]
    graphs = max(p.sizes) * (max(p.ks) + 1) * vocab * (2 + 4 + 8 + 8)  # graph_parts.bytes_per_logit
    total = sum(kv.values()) + sum(weights.values()) + self_kv + graphs + (1 << 30)
    return {
        "kv_tokens": tokens,
        "kv_mb": {n: round(b / 2**20 * 1.02 + 16, 1) for n, b in kv.items()},
        "self_draft_kv_mb": round(self_kv / 2**20 * 1.02 + 16, 1),
        "weights_gb": round(sum(weights.values()) / 1e9, 2),
        "graphs_gb": round(graphs / 1e9, 2),
        "total_gb": round(total / 1e9, 2),
    }


def round_shapes(tiny: bool, dtype: Any = None) -> list[Any]:
    """Every ``GraphRound`` the run builds, as ``graph_aot.RoundShape`` (the sections' ``max_k``s:
    plain 0, the oracle cells' ks, the scheduler's, the step and sampler sections' 5-row verify)."""
    import torch
    from trispec.runners.graph_aot import EngineShape, RoundShape

    p = Points.of(tiny)
    dtype = dtype or torch.bfloat16

    def shape(name: str) -> EngineShape:
        return EngineShape(model_args(name, tiny, p.max_context), dtype, BLOCK_SIZE, p.max_context)

    tag = "tiny" if tiny else "qwen"
    verify_ks = tuple(sorted({0, 4, SCHEDULER_K, *p.ks}))
    return [
        RoundShape(f"bench-{tag}: 7b <- 0.5b", shape("7b"), shape("0.5b"), verify_ks, p.sizes),
        RoundShape(f"bench-{tag}: 7b <- 7b (self)", shape("7b"), shape("7b"), (SELF_DRAFT_K,), p.sizes),
        RoundShape(f"bench-{tag}: 1.5b", shape("1.5b"), None, (0, 4), p.sizes),
        RoundShape(f"bench-{tag}: 0.5b", shape("0.5b"), None, (0, 4), p.sizes),
    ] + [  # the kernels section: one step at batch 1, greedy, eagerly on the device
        RoundShape(f"bench-{tag}: kernels {name}", shape(name), None, (0, 4), (1,), sampled=False)
        for name in QWEN
    ]
