"""Model arguments: the architecture of a Llama-family checkpoint, read from a Hugging Face
``config.json`` or from a GGUF's metadata, and written back as a HF config (for exports)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
