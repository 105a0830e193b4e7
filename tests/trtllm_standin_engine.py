"""The engine directories the TensorRT-LLM stand-in (``trtllm_standin``) loads: TensorRT-LLM's
``config.json`` schema, a ``rank0.engine`` whose size is the weights the GPU must hold, and
``standin.json`` naming the tiny random model (our torch engine, used only for the model's logits)
that stands for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny import tiny_args
from trispec.engine.random_weights import random_state_dict
from trispec.engine.torch_engine import TorchEngine

ENGINES: dict[str, TorchEngine] = {}  # one tiny model per stand-in engine, shared by executors


def _model(path: Path, vocab_size: int) -> TorchEngine:
    """The tiny model named by ``standin.json``: random weights of ``seed``, plus ``noise`` times the
    random weights of ``noise_seed`` when given (a draft that agrees with its target often, not always)."""
    spec = json.loads((path / "standin.json").read_text())
    key = json.dumps({**spec, "vocab": vocab_size}, sort_keys=True)
    if key not in ENGINES:
        args = tiny_args(vocab_size=vocab_size)
        state = random_state_dict(args, int(spec["seed"]))
        if spec.get("noise"):
            noise = random_state_dict(args, int(spec["noise_seed"]))
            state = {name: w + float(spec["noise"]) * noise[name] for name, w in state.items()}
        ENGINES[key] = TorchEngine.from_state_dict(args, state, num_blocks=4096, block_size=8)
    return ENGINES[key]


def write_engine(
    path: Path,
    *,
    vocab_size: int,
    seed: int,
    spec_mode: object = 1,
    max_draft_len: int = 0,
    weights_bytes: int = 0,
    noise: float = 0.0,
    noise_seed: int = 7,
    **overrides: Any,
) -> Path:
    """An engine directory: TensorRT-LLM's config.json schema, a ``rank0.engine`` of
    ``weights_bytes`` (sparse), and ``standin.json`` naming the tiny model it runs."""
    path.mkdir(parents=True, exist_ok=True)
    config = engine_config(
        vocab_size=vocab_size, spec_mode=spec_mode, max_draft_len=max_draft_len, **overrides
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    with (path / "rank0.engine").open("wb") as engine_file:
        engine_file.truncate(weights_bytes)
    model = {"seed": seed, "noise": noise, "noise_seed": noise_seed} if noise else {"seed": seed}
    (path / "standin.json").write_text(json.dumps(model))
    return path


def engine_config(
    *, vocab_size: int = 320, spec_mode: object = 1, max_draft_len: int = 0, **overrides: Any
) -> dict:
    """config.json as trtllm-build writes it (EngineConfig.to_dict()) for ``--max_seq_len 1000``:
    for an external-draft target it writes max_seq_len + max_draft_len (the room for the drafts);
    ``overrides`` by key path joined with ``__``."""
    external = spec_mode in (2, "DRAFT_TOKENS_EXTERNAL", "draft_tokens_external")
    config: dict[str, Any] = {
        "version": "1.2.1",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_size": 16,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            "max_batch_size": 64,
            "max_input_len": 900,
            "max_seq_len": 1000 + (max_draft_len if external else 0),
            "max_num_tokens": 8192,
            "max_beam_width": 1,
            "kv_cache_type": "PAGED",
            "gather_generation_logits": False,
            "speculative_decoding_mode": spec_mode,
            "max_draft_len": max_draft_len,
            "plugin_config": {
                "gemm_plugin": "bfloat16",
                "gpt_attention_plugin": "auto",
                "context_fmha": True,
                "paged_kv_cache": True,
                "remove_input_padding": True,
                "use_paged_context_fmha": True,
                "tokens_per_block": 32,
            },
        },
    }
    for dotted, value in overrides.items():
        node = config
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return config


@dataclass(frozen=True)
class _Engine:
    """What the executor reads from ``config.json``."""

    vocab_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    max_num_tokens: int
    draft_tokens_external: bool
    paged_context_fmha: bool
    tokens_per_block: int
    kv_bytes_per_token: int
    tp_size: int

    @classmethod
    def read(cls, path: Path) -> _Engine:
        config = json.loads((path / "config.json").read_text())
        pre, build = config["pretrained_config"], config["build_config"]
        plugin = build.get("plugin_config") or {}
        mode = build.get("speculative_decoding_mode")
        layers, heads = int(pre["num_hidden_layers"]), int(pre["num_key_value_heads"])
        return cls(
            vocab_size=int(pre["vocab_size"]),
            max_input_len=int(build["max_input_len"]),
            max_seq_len=int(build["max_seq_len"]),
            max_draft_len=int(build.get("max_draft_len") or 0),
            max_num_tokens=int(build.get("max_num_tokens") or 8192),
            draft_tokens_external=mode in (2, "DRAFT_TOKENS_EXTERNAL", "draft_tokens_external"),
            paged_context_fmha=bool(plugin.get("use_paged_context_fmha", False)),
            tokens_per_block=int(plugin.get("tokens_per_block") or 32),
            kv_bytes_per_token=layers * heads * int(pre["head_size"]) * 2 * 2,  # K and V, 16-bit
            tp_size=int(pre.get("mapping", {}).get("tp_size", 1)),
        )


GiB = 2**30


class SimulatedGpu:
    """GPU memory: what executors take, and what ``torch.cuda.mem_get_info`` would say is free."""

    def __init__(self, total_bytes: int = 80 * GiB) -> None:
        self.total_bytes = total_bytes
        self.used_bytes = 0

    def free_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.free_bytes():
            raise RuntimeError(
                f"[TensorRT-LLM][ERROR] CUDA runtime error in cudaMalloc: out of memory ({what}: "
                f"{nbytes} bytes, {self.free_bytes()} free)"
            )
        self.used_bytes += nbytes
