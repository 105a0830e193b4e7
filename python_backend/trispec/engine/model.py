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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from trispec.engine.args import ModelArgs
from trispec.engine.attention import make_attention
from trispec.engine.batch import Batch, SeqSpec, pack
from trispec.engine.cpu.gguf_stack import GGUFLayerStack, StackRows
from trispec.engine.cpu.linear import GGUFLinear, Linear, gguf_rows
from trispec.engine.cpu.quant_blocks import QuantBlocks
from trispec.engine.kv_cache import KVCache

# attention of one layer: (q, k, v, k_cache, v_cache) -> [T, H * D], after k/v were written
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


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


@dataclass
class KernelClock:
    """Where a model's forwards spend their time, for the bench's host time per token: per forward its
    rows and the seconds from the embedding lookup to the logits, which for a stack model are three
    kernel calls (embedding, the layer stack, the LM head) and a view. A model run layer by layer
    (Python ops between its kernels) records nothing."""

    forwards: list[tuple[int, float]] = field(default_factory=list)

    def reset(self) -> None:
        self.forwards.clear()


def _normed(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = rms_norm(x, eps)
    return h if weight is None else h * weight


def _linear_normed(linear: Linear, x: torch.Tensor, norm: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``linear(rms_norm(x) * norm)``: in the layer's own call where it takes the norm (GGUF blocks)."""
    if norm is not None and isinstance(linear, GGUFLinear):
        return linear.fused(x, norm=norm, eps=eps)
    return linear(_normed(x, norm, eps))


def _add_linear(x: torch.Tensor, linear: Linear, h: torch.Tensor) -> torch.Tensor:
    """``x + linear(h)``; GGUF layers add into ``x`` in place (the caller's own tensor)."""
    if isinstance(linear, GGUFLinear):
        return linear.fused(h, residual=x)
    return x + linear(h)


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
        head_ids: torch.Tensor | None = None,
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
        # the token ids ``lm_head`` computes (sorted), where not all of them (``full_vocab``)
        self.head_ids = None if head_ids is None else head_ids.to(embed.device)
        heads = (args.num_heads, args.num_kv_heads, args.head_dim)
        self.attention = make_attention(*heads, device=embed.device, dtype=dtype, backend=attention)
        cos, sin = rope_tables(args, rope_length or args.max_position_embeddings)
        self.cos, self.sin = cos.to(dtype).to(embed.device), sin.to(dtype).to(embed.device)
        self.kernel_clock: KernelClock | None = None  # set by a bench
        # every layer on the GGUF integer path: all of them in one C call (every forward, so that a
        # position's keys are the same bits whichever step computed them)
        self.stack = None
        if GGUFLayerStack.applies(layers, self.attention, dtype):
            self.stack = GGUFLayerStack(
                layers,
                self.attention,  # type: ignore[arg-type]
                hidden_size=args.hidden_size,
                intermediate_size=args.intermediate_size,
                eps=args.rms_norm_eps,
            )

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
        return pack(seqs, block_size, device=self.cos.device, attention=self.attention, dtype=self.dtype)

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
        attn, attention = batch.attn, self.attention

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor):
            return attention(attn, q, k, v, kc, vc)

        clock = self.kernel_clock if self.stack is not None else None
        t0 = time.perf_counter() if clock is not None else 0.0
        x = self.embed_tokens(batch.tokens)
        if self.stack is not None:
            rows = StackRows(self.cos, self.sin, batch.slots, batch.attn)  # type: ignore[arg-type]
            x = self.stack.run(x, rows, kv.k, kv.v)
        else:
            cos = self.cos[batch.positions].unsqueeze(1)
            sin = self.sin[batch.positions].unsqueeze(1)
            x = self.run_layers(x, cos, sin, batch.slots, kv, attend)
        lr = batch.logit_rows
        if not (isinstance(lr, slice) and lr.start == 0 and lr.stop == x.shape[0]):  # a decode step's: all
            x = x[lr]
        logits = self.full_vocab(_linear_normed(self.lm_head, x, self.norm, self.args.rms_norm_eps))
        if clock is not None:  # three C calls (and a view)
            clock.forwards.append((batch.tokens.shape[0], time.perf_counter() - t0))
        return logits if logits.dtype == torch.float32 else logits.float()

    def full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The LM head's logits over the whole vocabulary: where the head computes only some ids
        (``head_ids``, a draft's ``draft_vocab``), the others are -inf (never drafted)."""
        if self.head_ids is None:
            return logits
        out = logits.new_full((logits.shape[0], self.args.vocab_size), float("-inf"))
        return out.index_copy_(1, self.head_ids, logits)

    def run_layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        kv: KVCache,
        attend: Attend,
    ) -> torch.Tensor:
        """Every decoder layer over the packed rows ``x``: writes their keys/values at ``slots`` and
        returns the final hidden states (shared by ``forward`` and the static step)."""
        a = self.args
        H, KV, D = a.num_heads, a.num_kv_heads, a.head_dim
        eps, inter = a.rms_norm_eps, a.intermediate_size
        T = x.shape[0]
        for layer, kc, vc in zip(self.layers, kv.k_layers, kv.v_layers, strict=True):
            qkv = _linear_normed(layer.qkv, x, layer.attn_norm, eps)
            # Rotate q and k together (one set of rope ops for both).
            qk = apply_rope(qkv[:, : (H + KV) * D].view(T, H + KV, D), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + KV) * D :].view(T, KV, D)
            # Cache layout [KV, slots, D]: a sequence's keys per head are contiguous in a block.
            kc.index_copy_(1, slots, k.transpose(0, 1))
            vc.index_copy_(1, slots, v.transpose(0, 1))
            x = _add_linear(x, layer.o, attend(q, k, v, kc, vc))
            gu = _linear_normed(layer.gate_up, x, layer.mlp_norm, eps)
            x = _add_linear(x, layer.down, F.silu(gu[:, :inter]) * gu[:, inter:])
        return x


def _distinct_bytes(tensors: list[torch.Tensor]) -> int:
    # a packed (opaque) tensor has no storage to share
    unique = {t.data_ptr() if t.layout == torch.strided else -i: t for i, t in enumerate(tensors, 1)}
    return sum(t.numel() * t.element_size() for t in unique.values())
