"""Load real weights (never pickle) into a HF-named float32 state dict plus ``ModelArgs``.

* HF layout: a directory with ``config.json`` and ``model.safetensors`` (or a sharded
  ``model.safetensors.index.json``).
* GGUF (llama.cpp): metadata -> ``ModelArgs``; every tensor dequantized to float32 with
  ``gguf.quants.dequantize`` (Q4_0/Q4_1/Q8_0/K-quants/F16/...). llama.cpp's converter permutes the rows
  of ``attn_q``/``attn_k`` for the llama architecture (its RoPE pairs adjacent dims, HF pairs halves);
  we undo that so the tensors are exactly HF's. Qwen2 files are not permuted.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import numpy as np
import torch

from trispec.engine.args import ModelArgs
from trispec.errors import ConfigError

StateDict = dict[str, torch.Tensor]


def load_checkpoint(path: str | Path) -> tuple[ModelArgs, StateDict]:
    """A GGUF file or a HF safetensors directory -> (args, HF-named float32 state dict).

    The last result is cached (keyed by path and mtime): a target and its self-draft engine load
    the same file, and parsing a GGUF's tokenizer metadata alone takes seconds. Callers must not
    modify the returned tensors in place.
    """
    p = Path(path).resolve()
    stamp = p.stat().st_mtime_ns if p.exists() else 0
    return _load_checkpoint_cached(str(p), stamp)


@functools.lru_cache(maxsize=1)
def _load_checkpoint_cached(path: str, _mtime_ns: int) -> tuple[ModelArgs, StateDict]:
    p = Path(path)
    if p.is_dir():
        return load_safetensors_dir(p)
    if p.is_file() and p.suffix == ".gguf":
        return load_gguf(p)
    if p.is_file() and p.name == "config.json":
        return load_safetensors_dir(p.parent)
    raise ConfigError("checkpoint", f"{path}: expected a .gguf file or a directory with config.json")


# -- HF safetensors -----------------------------------------------------------------------------------


def load_safetensors_dir(directory: str | Path) -> tuple[ModelArgs, StateDict]:
    from safetensors.torch import load_file

    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ConfigError("checkpoint", f"{d}: no config.json")
    args = ModelArgs.from_hf_config(json.loads(cfg_path.read_text()))
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (d / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(f.name for f in d.glob("*.safetensors"))
    if not files:
        raise ConfigError("checkpoint", f"{d}: no .safetensors files")
    sd: StateDict = {}
    for f in files:
        sd.update(load_file(str(d / f)))
    return args, {k: v.to(torch.float32) for k, v in sd.items()}


# -- GGUF ---------------------------------------------------------------------------------------------

_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")


def gguf_to_hf_name(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if unused (rope_freqs)."""
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _GGUF_LAYER:
        return f"model.layers.{m.group(1)}.{_GGUF_LAYER[m.group(2)]}"
    return None


def unpermute_llama_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: per head, rows (d0 d1)(d2 d3).. -> halves [d0 d2 ..][d1 d3 ..].

    llama.cpp: ``w.reshape(n_head, 2, dim, ...).swapaxes(1, 2)``; undo with the reverse reshape.
    """
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize_tensor(tensor: object) -> torch.Tensor:
    """A ``gguf.ReaderTensor`` -> float32 torch tensor in PyTorch orientation ``[out, in]``."""
    from gguf.quants import dequantize

    data = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # type: ignore[attr-defined]
    shape = tuple(int(s) for s in reversed(tensor.shape))  # type: ignore[attr-defined]  # GGUF: [in, out]
    data = data.reshape(shape)
    # F32/F16 tensors come back as read-only views of the memory-mapped file: copy those.
    return torch.from_numpy(data if data.flags.writeable and data.flags.c_contiguous else data.copy())


def load_gguf(path: str | Path) -> tuple[ModelArgs, StateDict]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    args = ModelArgs.from_gguf(reader)
    sd: StateDict = {}
    for t in reader.tensors:
        name = gguf_to_hf_name(t.name)
        if name is None:
            continue
        w = dequantize_tensor(t)
        if args.arch == "llama" and t.name.endswith(("attn_q.weight", "attn_q.bias")):
            w = unpermute_llama_qk(w, args.num_heads)
        elif args.arch == "llama" and t.name.endswith(("attn_k.weight", "attn_k.bias")):
            w = unpermute_llama_qk(w, args.num_kv_heads)
        sd[name] = w
    if "model.embed_tokens.weight" not in sd:
        raise ConfigError("checkpoint", f"{path}: no token_embd.weight")
    return args, sd
