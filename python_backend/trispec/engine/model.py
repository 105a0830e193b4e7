"""A compact Llama-family decoder (Llama, SmolLM2, Qwen2) running on a packed, ragged batch.

The forward pass takes the NEW tokens of many sequences packed into one ``[T]`` vector (each
sequence its own count and start position) and the paged KV cache:

* every linear layer runs once over all ``T`` packed tokens (the big win of batching on CPU);
* attention (``attention.py``) reads each sequence's keys/values from the paged cache through its
  block table. On CPU it is our batch-invariant kernel: every row's output depends only on its own
  query and keys, never on what else is in the batch (see attention.py for why and the fallback);
* every op outside attention is row-wise (norms, RoPE, SwiGLU, residuals) or a prepacked oneDNN /
  int8 GEMM whose rows do not depend on the row count, so a token's logits are bit-identical alone,
  in a batch of 32, or verified together with k drafts;
* the LM head (the biggest matmul for a 49k vocabulary) runs only on rows whose logits are wanted.

Weights are plain tensors and plain callables (no ``nn.Module`` per layer): at 1-5 tokens a step is
~120 matmuls plus ~40 small ops per layer, and the Python/dispatch cost of the small ops is a
visible part of a 135M model's step on 2 cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.nn.functional as F

from trispec.engine.attention import SeqRows, make_attention
from trispec.engine.kv_cache import KVCache
from trispec.errors import ConfigError

Arch = Literal["llama", "qwen2"]
# HF ``model_type`` values that are the same network as one of ours.
_HF_MODEL_TYPES: dict[str, Arch] = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}


@dataclass(frozen=True)
class ModelArgs:
    arch: Arch
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    # Bias on q/k/v (always on for Qwen2). For Llama, HF's ``attention_bias`` also adds an o_proj bias.
    attention_bias: bool = False
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.arch not in ("llama", "qwen2"):
            raise ConfigError("arch", f"unsupported architecture {self.arch!r} (llama, qwen2)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", f"{self.num_kv_heads} does not divide {self.num_heads} heads")
        if self.head_dim % 2:
            raise ConfigError("head_dim", f"must be even for RoPE, got {self.head_dim}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def o_bias(self) -> bool:
        return self.arch == "llama" and self.attention_bias

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelArgs:
        """From a HF ``config.json`` dict (transformers 4.x ``rope_theta`` or 5.x ``rope_parameters``)."""
        model_type = cfg.get("model_type", "llama")
        arch = _HF_MODEL_TYPES.get(model_type)
        if arch is None:
            raise ConfigError("model_type", f"unsupported model_type {model_type!r}")
        rope = cfg.get("rope_parameters") or {}
        rope_scaling = cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or rope_scaling.get("rope_type") or rope_scaling.get("type")
        if rope_type not in (None, "default"):
            raise ConfigError("rope_scaling", f"rope type {rope_type!r} is not supported")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError("hidden_act", f"only silu is supported, got {cfg['hidden_act']!r}")
        if cfg.get("mlp_bias"):
            raise ConfigError("mlp_bias", "MLP biases are not supported")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=True if arch == "qwen2" else bool(cfg.get("attention_bias", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        )

    @classmethod
    def from_gguf(cls, reader: Any) -> ModelArgs:
        """From a ``gguf.GGUFReader``'s metadata (llama or qwen2 architecture)."""

        def get(key: str, default: Any = None) -> Any:
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        arch = get("general.architecture")
        if arch not in ("llama", "qwen2"):
            raise ConfigError("general.architecture", f"unsupported GGUF architecture {arch!r}")
        hidden = int(get(f"{arch}.embedding_length"))
        heads = int(get(f"{arch}.attention.head_count"))
        names = {t.name: t for t in reader.tensors}
        vocab = get(f"{arch}.vocab_size")
        if vocab is None:  # older files: the embedding's row count (GGUF shapes are [in, out])
            vocab = int(names["token_embd.weight"].shape[-1])
        if get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
            raise ConfigError("rope.scaling.type", "RoPE scaling is not supported")
        return cls(
            arch=arch,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get(f"{arch}.feed_forward_length")),
            num_layers=int(get(f"{arch}.block_count")),
            num_heads=heads,
            num_kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(get(f"{arch}.attention.key_length", hidden // heads)),
            rope_theta=float(get(f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            tie_embeddings="output.weight" not in names,
            attention_bias=arch == "qwen2",
            max_position_embeddings=int(get(f"{arch}.context_length", 2048)),
        )

    def to_hf_config(self) -> dict[str, Any]:
        """A HF config dict (``LlamaConfig(**d)`` / ``Qwen2Config(**d)``) describing the same model."""
        cfg: dict[str, Any] = {
            "model_type": self.arch,
            "architectures": ["LlamaForCausalLM" if self.arch == "llama" else "Qwen2ForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
        }
        if self.arch == "llama":
            cfg["attention_bias"] = self.attention_bias
        return cfg


# ---------------------------------------------------------------------------------------------------
# Linear layers: dense (fp32/bf16) here, int8 weight-only in quant.py. Plain callables, not Modules.


class Linear(Protocol):
    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def _has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_NATIVE_BF16 = _has_native_bf16()


def _find_onednn_linear() -> Any:
    """oneDNN's prepacked linear (what inductor uses on CPU), if it works in this build.

    Returns the resolved op overload: calling ``torch.ops.mkldnn._linear_pointwise`` by attribute
    costs ~10 us per call in overload resolution, 1 ms per step over 121 matmuls.
    """
    try:
        op = torch.ops.mkldnn._linear_pointwise.default
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4, 8), 5)
        ok = torch.equal(op(torch.ones(2, 8), w, None, "none", [], ""), torch.full((2, 4), 8.0))
    except (AttributeError, RuntimeError):
        return None
    return op if ok else None


_onednn_linear = _find_onednn_linear()


class DenseLinear:
    """``y = x W^T + b`` through oneDNN's prepacked kernel.

    Why prepacked oneDNN: (1) speed — on the 2-core AVX2 CPU (SmolLM2-135M, 2 threads) a 5-token
    verify step costs ~1.9x a 1-token decode with MKL (F.linear), ~1.2-1.3x with oneDNN's brgemm;
    (2) batch invariance — measured on AVX2 and AVX-512, each output row of the prepacked kernel is
    bit-identical whatever the number of rows (MKL's sgemm is not: 1 row takes a GEMV path).
    bfloat16 weights are packed as bfloat16 where oneDNN runs it natively (AVX-512 BF16 / AMX /
    AVX-NE-CONVERT); elsewhere they are widened to float32 once at load and packed (the values are
    still the bf16-rounded weights; the memory is float32's): torch's own bf16 GEMM there costs ~M
    times a 1-row GEMV and switching kernels by row count would break the invariance.
    ``prepack=False`` (or a build without oneDNN) keeps a plain tensor and ``F.linear``.
    """

    # Batch-size hint for the packed layout: the verify step (a few tokens) is the one to win.
    PACK_HINT = 5

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.out_dtype = weight.dtype
        self.weight: torch.Tensor | None = weight.contiguous()
        self.packed: torch.Tensor | None = None
        self.bias = bias
        if prepack and _onednn_linear is not None and weight.device.type == "cpu":
            if weight.dtype == torch.bfloat16 and not _NATIVE_BF16:
                weight, bias = weight.float(), None if bias is None else bias.float()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), self.PACK_HINT)
            self.bias = bias
            self.weight = None  # the packed copy replaces it
            self.pad_one_row = not self._one_row_agrees()

    # Whether a single row must be computed as two. oneDNN's one-row path can split a long
    # reduction across threads (on AVX-512, K >= 1536 in SmolLM2 / Qwen2.5 shapes), and the row then
    # differs in the last bits from the same row among others; every row count >= 2 agrees (measured
    # up to 600 rows, AVX2 and AVX-512). For float32 this is checked once per layer on a fixed probe:
    # a different summation order shows in nearly every output (85-95 % of them measured), and
    # padding only where needed saves ~1 ms per 1-token step. bfloat16 outputs hide most of the
    # difference in their rounding (1 output in ~7000 differs), so no probe can clear a bf16 layer:
    # those always pad.
    pad_one_row = False

    def _one_row_agrees(self) -> bool:
        assert self.packed is not None
        if self.packed.dtype != torch.float32:
            return False
        generator = torch.Generator().manual_seed(0)
        probe = torch.randn(2, self.in_features, generator=generator)
        two = _onednn_linear(probe, self.packed, self.bias, "none", [], "")
        one = _onednn_linear(probe[:1].contiguous(), self.packed, self.bias, "none", [], "")
        return torch.equal(one[0], two[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)  # type: ignore[arg-type]
        if x.shape[0] == 1 and self.pad_one_row:
            return self(torch.cat((x, x)))[:1]
        if self.packed.dtype != x.dtype:  # bf16 widened to fp32 (no native bf16)
            return _onednn_linear(x.to(self.packed.dtype), self.packed, self.bias, "none", [], "").to(x.dtype)
        return _onednn_linear(x, self.packed, self.bias, "none", [], "")


@dataclass
class LayerWeights:
    # RMSNorm weights are folded into the columns of the linear layer that follows each norm
    # (W @ (w * n) == (W * w) @ n): one elementwise op less per norm.
    qkv: Linear  # q, k, v fused (and input_layernorm folded in): one matmul instead of three
    o: Linear
    gate_up: Linear  # gate and up fused (post_attention_layernorm folded in)
    down: Linear


# ---------------------------------------------------------------------------------------------------
# Per-forward metadata, computed once and shared by every layer.


@dataclass
class Batch:
    tokens: torch.Tensor  # [T] packed new tokens (sequences grouped by new-token count)
    cos: torch.Tensor  # [T, 1, D]
    sin: torch.Tensor  # [T, 1, D] (sign folded in, see ``apply_rope``)
    slots: torch.Tensor  # [T] cache slot of each new token
    attn: object  # the attention backend's plan for this batch
    logit_rows: torch.Tensor | slice  # packed rows to run the LM head on


@dataclass(frozen=True)
class SeqSpec:
    """One sequence of a forward: ``n`` new tokens appended at ``start`` (its cached length)."""

    tokens: Sequence[int]
    start: int
    block_table: Sequence[int]
    num_logits: int


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
        dtype: torch.dtype = torch.float32,
        rope_length: int | None = None,
        attention: str = "auto",
    ) -> None:
        self.args = args
        self.dtype = dtype
        self.embed = embed  # [V, hidden]; int8 when embed_scales is given (per-row scales)
        self.embed_scales = embed_scales
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.attention = make_attention(
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
            device=embed.device,
            dtype=dtype,
            backend=attention,
        )
        cos, sin = rope_tables(args, rope_length or args.max_position_embeddings)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)

    # -- batch metadata ------------------------------------------------------------------------
    def make_batch(self, seqs: Sequence[SeqSpec], block_size: int) -> tuple[Batch, list[tuple[int, int]]]:
        """Pack ``seqs`` (grouped by new-token count) and precompute what every layer needs.

        Returns the batch and, for each input sequence in order, ``(first_logit_row, num_logits)``
        into the logits that ``forward`` returns.
        """
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens))
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows: list[SeqRows] = []
        logit_rows: list[int] = []
        logit_span: list[tuple[int, int]] = [(0, 0)] * len(seqs)
        for i in order:
            s = seqs[i]
            n, t0 = len(s.tokens), len(tokens)
            logit_span[i] = (len(logit_rows), s.num_logits)
            logit_rows.extend(range(t0 + n - s.num_logits, t0 + n))
            tokens.extend(s.tokens)
            table = s.block_table
            for pos in range(s.start, s.start + n):
                positions.append(pos)
                slots.append(table[pos // block_size] * block_size + pos % block_size)
            if n:
                rows.append(SeqRows(t0, n, s.start, table))
        lr: torch.Tensor | slice
        if logit_rows and logit_rows == list(range(logit_rows[0], logit_rows[0] + len(logit_rows))):
            lr = slice(logit_rows[0], logit_rows[0] + len(logit_rows))  # a view, no gather
        else:
            lr = torch.tensor(logit_rows, dtype=torch.long)
        pos_t = torch.tensor(positions, dtype=torch.long)
        batch = Batch(
            tokens=torch.tensor(tokens, dtype=torch.long),
            cos=self.cos[pos_t].unsqueeze(1),
            sin=self.sin[pos_t].unsqueeze(1),
            slots=torch.tensor(slots, dtype=torch.long),
            attn=self.attention.plan(rows, block_size, self.dtype),
            logit_rows=lr,
        )
        return batch, logit_span

    # -- forward -------------------------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
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
            qkv = layer.qkv(rms_norm(x, eps))
            # Rotate q and k together (one set of rope ops for both).
            qk = apply_rope(qkv[:, : (H + KV) * D].view(T, H + KV, D), cos, sin)
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, (H + KV) * D :].view(T, KV, D)
            # Cache layout [KV, slots, D]: gathered keys are contiguous per head for SDPA.
            kc.index_copy_(1, slots, k.transpose(0, 1))
            vc.index_copy_(1, slots, v.transpose(0, 1))
            x = x + layer.o(self.attention(batch.attn, q, k, v, kc, vc))
            gu = layer.gate_up(rms_norm(x, eps))
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
) -> Transformer:
    """Fuse a HF-named state dict (``model.layers.N.self_attn.q_proj.weight`` ...) into our layout.

    ``weight_quant="int8"``: every linear layer (and the embedding / LM head) becomes weight-only
    int8 with per-output-channel scales; activations run in ``dtype`` (bfloat16 is the fast path).
    """
    from trispec.engine import quant

    if weight_quant not in (None, "int8"):
        raise ConfigError("weight_quant", f"unsupported weight_quant {weight_quant!r} (None, 'int8')")

    def get(name: str) -> torch.Tensor:
        t = state_dict.get(name)
        if t is None:
            raise ConfigError("checkpoint", f"missing tensor {name!r}")
        return t.detach().to(torch.float32)

    def linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        b = None if bias is None else bias.to(dtype)
        if weight_quant == "int8":
            return quant.Int8Linear.from_float(weight, b, dtype=dtype)
        return DenseLinear(weight.to(dtype), b)

    layers = []
    for i in range(args.num_layers):
        p = _HF_LAYER.format(i)
        attn_norm = get(p + "input_layernorm.weight")
        qkv_w = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]) * attn_norm
        qkv_b = (
            torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if args.attention_bias else None
        )
        o_b = get(p + "self_attn.o_proj.bias") if args.o_bias else None
        mlp_norm = get(p + "post_attention_layernorm.weight")
        gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]) * mlp_norm
        layers.append(
            LayerWeights(
                qkv=linear(qkv_w, qkv_b),
                o=linear(get(p + "self_attn.o_proj.weight"), o_b),
                gate_up=linear(gate_up),
                down=linear(get(p + "mlp.down_proj.weight")),
            )
        )
    embed_f = get("model.embed_tokens.weight")
    if weight_quant == "int8":
        embed_q = quant.Int8Linear.from_float(embed_f, None, dtype=dtype)
        embed, embed_scales = embed_q.weight, embed_q.scales
        if args.tie_embeddings:
            lm_head: Linear = embed_q  # one int8 table serves lookup and LM head
        else:
            lm_head = linear(get("lm_head.weight"))
    else:
        embed, embed_scales = embed_f.to(dtype).contiguous(), None
        lm_head = DenseLinear(embed) if args.tie_embeddings else linear(get("lm_head.weight"))
    return Transformer(
        args,
        embed=embed,
        layers=layers,
        norm=get("model.norm.weight").to(dtype),
        lm_head=lm_head,
        embed_scales=embed_scales,
        dtype=dtype,
        rope_length=rope_length,
        attention=attention,
    )


def random_state_dict(args: ModelArgs, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random HF-named weights (fp32).

    HF's init (normal, std 0.02) makes a tiny model's logits nearly flat and greedy decoding a
    constant token. Here projections are 1/sqrt(fan_in)-scaled, and the residual writers (o, down)
    get gain 2 over a 0.3-std embedding so that the layers, not the current token's own embedding,
    dominate the final hidden state: with tied embeddings the latter makes greedy repeat the input.
    """
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    h, inter, d = args.hidden_size, args.intermediate_size, args.head_dim
    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(args.vocab_size, h, std=0.3)}
    for i in range(args.num_layers):
        p = _HF_LAYER.format(i)
        sd[p + "input_layernorm.weight"] = 1.0 + normal(h, std=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1.0 + normal(h, std=0.1)
        sd[p + "self_attn.q_proj.weight"] = normal(args.num_heads * d, h, std=h**-0.5)
        sd[p + "self_attn.k_proj.weight"] = normal(args.num_kv_heads * d, h, std=h**-0.5)
        sd[p + "self_attn.v_proj.weight"] = normal(args.num_kv_heads * d, h, std=h**-0.5)
        sd[p + "self_attn.o_proj.weight"] = normal(
            h, args.num_heads * d, std=2 * (args.num_heads * d) ** -0.5
        )
        if args.attention_bias:
            for n, size in (("q", args.q_size), ("k", args.kv_size), ("v", args.kv_size)):
                sd[p + f"self_attn.{n}_proj.bias"] = normal(size, std=0.02)
        if args.o_bias:
            sd[p + "self_attn.o_proj.bias"] = normal(h, std=0.02)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, h, std=h**-0.5)
        sd[p + "mlp.up_proj.weight"] = normal(inter, h, std=h**-0.5)
        sd[p + "mlp.down_proj.weight"] = normal(h, inter, std=2 * inter**-0.5)
    sd["model.norm.weight"] = 1.0 + normal(h, std=0.1)
    if not args.tie_embeddings:
        sd["lm_head.weight"] = normal(args.vocab_size, h, std=h**-0.5)
    return sd
