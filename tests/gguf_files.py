"""GGUF files written for tests (``gguf.GGUFWriter``): a HF-named state dict stored the way llama.cpp's
converter stores it (llama q/k rows permuted), each tensor as F32 or the quantised type asked for.

gguf-py quantises the legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) but has no quantiser for K-quants:
for those, ``random_blocks`` makes valid blocks (finite scales, random codes) whose values the
tests then read back through the loader, so every check compares against what the file holds.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from trispec.engine.args import ModelArgs
from trispec.engine.random_weights import random_state_dict

T = GGMLQuantizationType
# types gguf-py can quantise from floats
QUANTISABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16)
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
# where each K-quant block keeps its float16 scales (d, and dmin where there is one)
_SCALE_OFFSETS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to llama q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(
    qtype: GGMLQuantizationType, rows: int, columns: int, seed: int, scale: float = 0.01
) -> np.ndarray:
    """Valid K-quant blocks ``[rows, bytes per row]``: random codes and sub-block scales, float16 super-
    block scales of about ``scale`` (one of them subnormal, to cover that conversion)."""
    values, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, columns // values, nbytes), dtype=np.uint8)
    for offset in _SCALE_OFFSETS[qtype]:
        half = (rng.standard_normal(raw.shape[:2]) * scale).astype(np.float16)
        half.flat[0] = np.float16(3e-6)
        raw[:, :, offset : offset + 2] = half.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def encode(
    data: np.ndarray, qtype: GGMLQuantizationType | None, seed: int
) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """A 2-D float32 tensor as ``qtype`` (None: F32 as is); K-quants get random blocks instead."""
    if qtype is None or data.ndim != 2:
        return data, None
    if qtype in K_QUANTS:
        return random_blocks(qtype, data.shape[0], data.shape[1], seed), qtype
    return quantize(data, qtype), qtype


def write_gguf(
    path: Path,
    args: ModelArgs,
    sd: dict[str, torch.Tensor],
    *,
    types: Callable[[str], GGMLQuantizationType | None] = lambda name: None,
    metadata: Callable[[GGUFWriter], None] = lambda writer: None,
) -> None:
    """``sd`` as a GGUF file; ``types(hf_name)`` picks each 2-D tensor's type (None: F32);
    ``metadata(writer)`` adds more key/values."""
    w = GGUFWriter(str(path), args.arch)
    metadata(w)
    w.add_block_count(args.num_layers)
    w.add_context_length(args.max_position_embeddings)
    w.add_embedding_length(args.hidden_size)
    w.add_feed_forward_length(args.intermediate_size)
    w.add_head_count(args.num_heads)
    w.add_head_count_kv(args.num_kv_heads)
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(args.rms_norm_eps)
    w.add_vocab_size(args.vocab_size)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for i in range(args.num_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
    for seed, (hf_name, tensor) in enumerate(sd.items()):
        data = tensor.numpy().astype(np.float32)
        if args.arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = llama_cpp_permute(data, args.num_heads)
        elif args.arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = llama_cpp_permute(data, args.num_kv_heads)
        stored, qtype = encode(data, types(hf_name), seed)
        if qtype is None:
            w.add_tensor(names[hf_name], stored)
        else:
            w.add_tensor(names[hf_name], stored, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# a mix of every type the GGUF kernel decodes, the way llama.cpp mixes them within one model
MIXED_LEGACY = {
    "self_attn.q_proj.weight": T.Q4_0,
    "self_attn.k_proj.weight": T.Q4_1,
    "self_attn.v_proj.weight": T.Q8_0,  # q, k and v of one layer in three types
    "self_attn.o_proj.weight": T.Q5_0,
    "mlp.gate_proj.weight": T.Q5_1,
    "mlp.up_proj.weight": T.Q8_0,
    "mlp.down_proj.weight": T.Q4_0,
    "embed_tokens.weight": T.Q8_0,
    "lm_head.weight": T.Q5_0,
}


def mixed_legacy(name: str) -> GGMLQuantizationType | None:
    return next((t for suffix, t in MIXED_LEGACY.items() if name.endswith(suffix)), None)


# the K-quants as llama.cpp's Q4_K_M mixes them (widths must be whole 256-blocks): every layer on the
# GGUF kernel's integer path
MIXED_K = {
    "self_attn.q_proj.weight": T.Q4_K,
    "self_attn.k_proj.weight": T.Q4_K,
    "self_attn.v_proj.weight": T.Q6_K,
    "self_attn.o_proj.weight": T.Q5_K,
    "mlp.gate_proj.weight": T.Q4_K,
    "mlp.up_proj.weight": T.Q4_K,
    "mlp.down_proj.weight": T.Q6_K,
    "embed_tokens.weight": T.Q4_K,
    "lm_head.weight": T.Q6_K,
}


def mixed_k(name: str) -> GGMLQuantizationType | None:
    return next((t for suffix, t in MIXED_K.items() if name.endswith(suffix)), None)


@functools.cache
def random_gguf(args: ModelArgs, seed: int, mix: str = "legacy") -> Path:
    """A GGUF file of the random model ``(args, seed)``, written once per process: ``legacy`` stores
    its matrices in the legacy types of MIXED_LEGACY (any width that is a multiple of 32), ``k`` in
    MIXED_K's K-quants (random blocks: widths of whole 256-blocks)."""
    folder = Path(tempfile.mkdtemp(prefix="specdec-test-gguf-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the process's cache: gone with it
    path = folder / f"{args.arch}-{seed}-{mix}.gguf"
    types = {"legacy": mixed_legacy, "k": mixed_k, "f32": lambda name: None}[mix]
    write_gguf(path, args, random_state_dict(args, seed), types=types)
    return path
