"""The static step with fused elementwise kernels (``fused_kernels.py``): the GPU path's layers at
nine kernels (ten with split-KV attention) instead of eighteen. Same inputs and outputs as
``static_step.forward_static``'s unfused layers (``Transformer.run_layers``); the eager CPU engine
keeps its own path.

Per layer: QKV GEMM (no bias) -> bias + rotary + KV write -> attention (+ merge) -> O GEMM ->
residual add + RMSNorm -> gate/up GEMM -> SiLU * up -> down GEMM -> residual add + the next layer's
RMSNorm. Before the first layer the embedding lookup and its norm are one kernel; after the last the
residual add and the final norm run only on the logit rows. The norm weights are folded into the
next GEMM (``LayerWeights``), so only the final norm multiplies a weight.
"""

from __future__ import annotations

import copy
import weakref

import torch

from trispec.engine.cpu.linear import DenseLinear, Linear
from trispec.engine.gpu.fused_kernels import add_rms_norm, bias_rope_write, silu_mul
from trispec.engine.kv_cache import KVCache
from trispec.engine.model import Attend, Transformer, rms_norm


def forward_fused(model: Transformer, kv: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, logit_rows: torch.Tensor, attend: Attend) -> torch.Tensor:  # fmt: skip
    """Every layer and the final norm over ``tokens``: writes their keys/values at ``slots``; returns
    the normed hidden states of ``logit_rows`` (the LM head's input)."""
    a = model.args
    H, KV, D, eps = a.num_heads, a.num_kv_heads, a.head_dim, a.rms_norm_eps
    weights = _unbiased(model)
    if model.embed_scales is None and model.embed_blocks is None:
        x = torch.empty(tokens.shape[0], a.hidden_size, dtype=model.dtype, device=tokens.device)
        h = add_rms_norm(model.embed, eps, rows=tokens, residual=x)
    else:  # int8 / GGUF tables (CPU builds): looked up as the eager path does
        x = model.embed_tokens(tokens)
        h = add_rms_norm(x, eps)
    last = len(model.layers) - 1
    for i, (layer, kc, vc) in enumerate(zip(model.layers, kv.k_layers, kv.v_layers, strict=True)):
        qkv_gemm, bias = weights[i]
        qkv = qkv_gemm(_scaled(h, layer.attn_norm))
        bias_rope_write(qkv, bias, model.cos, model.sin, positions, slots, kc, vc, heads=H, kv_heads=KV,
                        head_dim=D)  # fmt: skip
        q = qkv[:, : H * D].view(-1, H, D)
        k = qkv[:, H * D : (H + KV) * D].view(-1, KV, D)
        v = qkv[:, (H + KV) * D :].view(-1, KV, D)
        h = add_rms_norm(x, eps, delta=layer.o(attend(q, k, v, kc, vc)), residual=x)
        down = layer.down(silu_mul(layer.gate_up(_scaled(h, layer.mlp_norm))))
        if i < last:
            h = add_rms_norm(x, eps, delta=down, residual=x)
        else:
            h = add_rms_norm(x, eps, delta=down, rows=logit_rows, weight=model.norm)
    if not model.layers:
        h = rms_norm(x.index_select(0, logit_rows), eps) * model.norm
    return h


def _scaled(h: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    # GGUF layers keep their norm weights (CPU only); every other build folded them into the GEMM
    return h if weight is None else h * weight


_cache: weakref.WeakKeyDictionary[Transformer, list[tuple[Linear, torch.Tensor | None]]] = (
    weakref.WeakKeyDictionary()
)


def _unbiased(model: Transformer) -> list[tuple[Linear, torch.Tensor | None]]:
    """Per layer: the QKV projection without its bias, and the bias (added by ``bias_rope_write``).
    A projection other than ``DenseLinear`` keeps its bias (and None is returned for it)."""
    if model not in _cache:
        out = []
        for layer in model.layers:
            linear, bias = layer.qkv, None
            if isinstance(linear, DenseLinear) and linear.bias is not None:
                bias, linear = linear.bias, copy.copy(linear)
                linear.bias = None  # the same (packed) weight, no bias
            out.append((linear, bias))
        _cache[model] = out
    return _cache[model]
