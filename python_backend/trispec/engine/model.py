"""A compact Llama-family decoder (Llama, SmolLM2, Qwen2) over a packed, ragged batch: the NEW
tokens of many sequences in one ``[T]`` vector (each its own count and start) and the paged KV cache.

* every linear layer runs once over all ``T`` packed tokens (the big win of batching on CPU);
* attention (``attention.py``) reads each sequence's keys/values through its block table; on CPU
  with our batch-invariant kernel, and every other op is row-wise or a GEMM whose rows do not depend
  on the row count, so a token's logits are bit-identical alone, in a batch of 32, or with k drafts;
* the LM head (the biggest matmul for a 49k vocabulary) runs only on rows whose logits are wanted.

Weights are plain tensors and callables (no ``nn.Module`` per layer): at 1-5 tokens a step's
Python/dispatch cost of ~40 small ops per layer is visible on a 135M model on 2 cores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trispec.engine.args import ModelArgs
from trispec.engine.attention import make_attention
from trispec.engine.batch import Batch, SeqSpec, pack
from trispec.engine.kv_cache import KVCache
from trispec.engine.linear import (
    DenseLinear,
    GGUFLinear,
    Int8Linear,
    Linear,
    RowSplitLinear,
    gguf_rows,
    gguf_supported,
    require_gguf_kernel,
)
from trispec.engine.weights import QuantBlocks
from trispec.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class LayerWeights:
    # RMSNorm weights are folded into the columns of the linear layer that follows each norm
    # (W @ (w * n) == (W * w) @ n): one elementwise op less per norm. GGUF blocks cannot take them
    # (that would change the file's values): those layers keep the norm weights (attn_norm, mlp_norm)
    # and multiply them in.
    qkv: Linear  # q, k, v fused (and input_layernorm folded in): one matmul instead of three
    o: Linear
    gate_up: Linear  # gate and up fused (post_attention_layernorm folded in)
    down: Linear
    attn_norm: torch.Tensor | None = None
    mlp_norm: torch.Tensor | None = None


def _normed(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = rms_norm(x, eps)
    return h if weight is None else h * weight


def rope_tables(args: ModelArgs, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / signed-sin tables ``[length, head_dim]`` (HF rotate_half convention, fp32)."""
    d = args.head_dim
    # Same arithmetic as HF's default rope init so that fp32 parity is exact.
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    # rotate_half(x) * sin == roll(x, d/2) * [-sin_lo, sin_hi]: one roll instead of two slices + cat.
    sin = torch.cat((-sin[:, : d // 2], sin[:, d // 2 :]), dim=-1)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; cos/sin: [T, 1, D]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without weight (folded into the next matmul)."""
    if x.dtype == torch.float32:
        # Spelled out: ~8 us/call less than F.rms_norm's composite (which adds dtype round trips).
        return x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True).add_(eps))
    return F.rms_norm(x, (x.shape[-1],), None, eps)  # ATen computes reduced precision in fp32


class Transformer:
    """The network: weights + ``forward(batch, kv)``. Build batches with ``make_batch``."""

    def __init__(
        self,
        args: ModelArgs,
        *,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: Linear,
        embed_scales: torch.Tensor | None = None,
        embed_blocks: QuantBlocks | None = None,
        dtype: torch.dtype = torch.float32,
        rope_length: int | None = None,
        attention: str = "auto",
    ) -> None:
        self.args = args
        self.dtype = dtype
        # [V, hidden]; int8 when embed_scales is given (per-row scales); the GGUF rows' bytes when
        # embed_blocks is (rows decoded as they are looked up)
        self.embed = embed
        self.embed_scales = embed_scales
        self.embed_blocks = embed_blocks
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        heads = (args.num_heads, args.num_kv_heads, args.head_dim)
        self.attention = make_attention(*heads, device=embed.device, dtype=dtype, backend=attention)
        cos, sin = rope_tables(args, rope_length or args.max_position_embeddings)
        self.cos, self.sin = cos.to(dtype).to(embed.device), sin.to(dtype).to(embed.device)

    def linears(self) -> list[Linear]:
        return [
            self.lm_head,
            *(m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)),
        ]

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight the network holds, as stored (packed, quantized); a tensor shared
        by two roles (a tied int8 embedding and LM head) counts once."""
        norms = [n for layer in self.layers for n in (layer.attn_norm, layer.mlp_norm) if n is not None]
        tensors = [t for t in (self.embed, self.embed_scales, self.norm, *norms) if t is not None]
        return _distinct_bytes(tensors + [t for m in self.linears() for t in m.tensors()])

    @property
    def streamed_bytes(self) -> int:
        """Bytes a 1-token step reads from the weights: the linear layers' (the LM head's
        included), not the embedding table, of which it reads a row."""
        return _distinct_bytes([t for m in self.linears() for t in m.tensors()])

    def make_batch(self, seqs: Sequence[SeqSpec], block_size: int) -> tuple[Batch, list[tuple[int, int]]]:
        """Pack ``seqs`` for ``forward`` (see ``batch.pack``)."""
        return pack(seqs, block_size, cos=self.cos, sin=self.sin, attention=self.attention, dtype=self.dtype)

    # -- forward -------------------------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.embed_blocks is not None:
            return gguf_rows(self.embed_blocks, tokens)
        if self.embed_scales is None:
            return F.embedding(tokens, self.embed)
        # int8 table: dequantize only the looked-up rows.
        return F.embedding(tokens, self.embed).to(self.dtype) * self.embed_scales[tokens, None]

    def forward(self, batch: Batch, kv: KVCache) -> torch.Tensor:
        """Run the packed batch; write its keys/values; return float32 logits of ``logit_rows``."""
        a = self.args
        H, KV, D = a.num_heads, a.num_kv_heads, a.head_dim
        eps, inter = a.rms_norm_eps, a.intermediate_size
        x = self.embed_tokens(batch.tokens)
        T = x.shape[0]
        cos, sin, slots = batch.cos, batch.sin, batch.slots
        for layer, kc, vc in zip(self.layers, kv.k_layers, kv.v_layers, strict=True):
            qkv = layer.qkv(_normed(x, layer.attn_norm, eps))
            # Rotate q and k together (one set of rope ops for both).
            qk = apply_rope(qkv[:, : (H + KV) * D].view(T, H + KV, D), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + KV) * D :].view(T, KV, D)
            # Cache layout [KV, slots, D]: a sequence's keys per head are contiguous in a block.
            kc.index_copy_(1, slots, k.transpose(0, 1))
            vc.index_copy_(1, slots, v.transpose(0, 1))
            x = x + layer.o(self.attention(batch.attn, q, k, v, kc, vc))
            gu = layer.gate_up(_normed(x, layer.mlp_norm, eps))
            x = x + layer.down(F.silu(gu[:, :inter]) * gu[:, inter:])
        x = rms_norm(x[batch.logit_rows], eps) * self.norm
        return self.lm_head(x).float()


# ---------------------------------------------------------------------------------------------------
# Building a Transformer from a HF-layout state dict.

_HF_LAYER = "model.layers.{}."


def build_transformer(
    args: ModelArgs,
    state_dict: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype = torch.float32,
    weight_quant: str | None = None,
    rope_length: int | None = None,
    attention: str = "auto",
    device: torch.device | None = None,
) -> Transformer:
    """Fuse a HF-named state dict (``model.layers.N.self_attn.q_proj.weight`` ...) into our layout.

    ``weight_quant="int8"``: every linear layer (and the embedding / LM head) becomes weight-only
    int8 with per-output-channel scales; activations run in ``dtype`` (bfloat16 is the fast path).
    ``weight_quant="gguf"``: the linear layers, embedding and LM head keep a GGUF file's own blocks
    (the state dict must come from one; float32 activations, CPU); a tensor of a type the GGUF kernel
    does not decode falls back to dense float32 (its whole fused layer).
    ``device``: where the weights go, tensor by tensor as they are built (default CPU).
    """
    if weight_quant not in (None, "int8", "gguf"):
        raise ConfigError("weight_quant", f"unsupported weight_quant {weight_quant!r} (None, 'int8', 'gguf')")
    device = device or torch.device("cpu")
    if weight_quant == "int8" and device.type != "cpu":
        raise ConfigError("precision", "int8 weight-only runs on CPU; on a GPU use bfloat16")
    blocks_of = _gguf_blocks_of(state_dict, weight_quant, dtype, device)

    def get(name: str) -> torch.Tensor:
        t = state_dict.get(name)
        if t is None:
            raise ConfigError("checkpoint", f"missing tensor {name!r}")
        return t.detach().to(torch.float32)

    def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        b = None if bias is None else bias.to(dtype).to(device)
        if weight_quant == "int8":
            return Int8Linear.from_float(weight, b, dtype=dtype)
        return DenseLinear(weight.to(dtype).to(device), b)  # prepacked on CPU only

    def fused(
        names: list[str], norm: torch.Tensor | None, bias: torch.Tensor | None = None
    ) -> tuple[Linear, torch.Tensor | None]:
        """The layer of these tensors side by side, with the norm before it folded in, or (GGUF blocks)
        kept to be multiplied in: (layer, norm weight still to apply)."""
        parts = blocks_of(names)
        if parts is not None:
            return GGUFLinear(parts, bias), norm
        weight = torch.cat([get(n) for n in names])
        return linear(weight if norm is None else weight.mul_(norm), bias), None

    layers = []
    for i in range(args.num_layers):
        p = _HF_LAYER.format(i)
        qkv_b = (
            torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if args.attention_bias else None
        )
        o_b = get(p + "self_attn.o_proj.bias") if args.o_bias else None
        qkv, attn_norm = fused(
            [p + f"self_attn.{n}_proj.weight" for n in "qkv"], get(p + "input_layernorm.weight"), qkv_b
        )
        gate_up, mlp_norm = fused(
            [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], get(p + "post_attention_layernorm.weight")
        )
        layers.append(
            LayerWeights(
                qkv=qkv,
                o=fused([p + "self_attn.o_proj.weight"], None, o_b)[0],
                gate_up=gate_up,
                down=fused([p + "mlp.down_proj.weight"], None)[0],
                attn_norm=attn_norm,
                mlp_norm=mlp_norm,
            )
        )
    embed_blocks = blocks_of(["model.embed_tokens.weight"])
    embed_scales = None
    if embed_blocks is not None:
        embed = embed_blocks[0].data
        lm_head: Linear = (
            GGUFLinear(embed_blocks) if args.tie_embeddings else fused(["lm_head.weight"], None)[0]
        )
    elif weight_quant == "int8":
        embed_q = Int8Linear.from_float(get("model.embed_tokens.weight"), None, dtype=dtype)
        embed, embed_scales = embed_q.weight, embed_q.scales
        # one int8 table serves lookup and a tied LM head
        lm_head = embed_q if args.tie_embeddings else linear(get("lm_head.weight"))
    else:
        embed = get("model.embed_tokens.weight").to(dtype).contiguous().to(device)
        if args.tie_embeddings:
            lm_head = DenseLinear(embed)
        elif weight_quant == "gguf":  # the embedding's type is not decoded: the head may still be
            lm_head = fused(["lm_head.weight"], None)[0]
        else:
            lm_head = dense_head(state_dict, args, dtype, device)
    return Transformer(
        args,
        embed=embed,
        layers=layers,
        norm=get("model.norm.weight").to(dtype).to(device),
        lm_head=lm_head,
        embed_scales=embed_scales,
        embed_blocks=None if embed_blocks is None else embed_blocks[0],
        dtype=dtype,
        rope_length=rope_length,
        attention=attention,
    )


def _gguf_blocks_of(
    state_dict: Mapping[str, torch.Tensor], weight_quant: str | None, dtype: torch.dtype, device: torch.device
) -> Callable[[list[str]], list[QuantBlocks] | None]:
    """For ``weight_quant="gguf"``: names -> their GGUF blocks, or None where one of them is of a type
    the kernel does not decode (that layer is built dense). Otherwise always None."""
    if weight_quant != "gguf":
        return lambda names: None
    if dtype != torch.float32 or device.type != "cpu":
        raise ConfigError("weights", "gguf weights run on the CPU with float32 activations (dtype: float32)")
    if not getattr(state_dict, "has_blocks", False):
        raise ConfigError("weights", "gguf weights need a .gguf checkpoint")
    require_gguf_kernel()
    read = state_dict.blocks  # type: ignore[attr-defined]

    def blocks_of(names: list[str]) -> list[QuantBlocks] | None:
        parts = [read(n) for n in names]
        if all(gguf_supported(b) for b in parts):
            return parts  # type: ignore[return-value]
        kinds = sorted({str(b.ggml_type) for b in parts if b is not None and not gguf_supported(b)})
        if kinds:
            logger.info(
                "%s: ggml type %s is not decoded by the GGUF kernel: dense", names[0], "/".join(kinds)
            )
        return None

    return blocks_of


def dense_head(
    state_dict: Mapping[str, torch.Tensor], args: ModelArgs, dtype: torch.dtype, device: torch.device
) -> Linear:
    """An untied LM head; for a large vocabulary on CPU in blocks of rows, read block by block."""
    name = "lm_head.weight"
    if name not in state_dict:
        raise ConfigError("checkpoint", f"missing tensor {name!r}")
    block = HEAD_BLOCK_ROWS
    if args.vocab_size <= block or device.type != "cpu":
        return DenseLinear(state_dict[name].to(dtype).to(device))
    rows = getattr(state_dict, "rows", lambda n, a, b: state_dict[n][a:b])
    parts = [
        DenseLinear(rows(name, start, min(start + block, args.vocab_size)).to(dtype).contiguous())
        for start in range(0, args.vocab_size, block)
    ]
    return RowSplitLinear(parts)


# rows per block of a large untied LM head (see RowSplitLinear)
HEAD_BLOCK_ROWS = 32768


def _distinct_bytes(tensors: list[torch.Tensor]) -> int:
    # a packed (opaque) tensor has no storage to share
    unique = {t.data_ptr() if t.layout == torch.strided else -i: t for i, t in enumerate(tensors, 1)}
    return sum(t.numel() * t.element_size() for t in unique.values())
