"""The fused elementwise kernels of the GPU static step (``fused_step.py``), one Triton kernel each:

* ``add_rms_norm``: the residual add and the RMSNorm after it (and the embedding lookup before the
  first layer, and the final norm over only the logit rows);
* ``bias_rope_write``: the QKV projection's bias, the rotary embedding of q and k, and the paged
  KV write, in place over the projection's output (a barrier between the row's loads and its stores:
  a lane's rotary partner may live in another warp);
* ``silu_mul``: SiLU(gate) * up.

Each computes in float32 and rounds where the unfused op it replaces rounds (x * cos before the
addcmul, the SiLU before the product), so the same inputs give the same bits except for sums taken in
another order (the norm's) and the QKV bias: added to the GEMM's rounded output here, inside the GEMM
in the unfused step. The two steps agree within the model dtype's rounding, not bit for bit.
Every grid depends on the padded row count only, so the kernels can be captured in CUDA graphs.
Under ``TRITON_INTERPRET=1`` (tests on the CPU) every bf16 tile is widened before arithmetic: the
interpreter does arithmetic on bf16 bit patterns.
"""

from __future__ import annotations

import torch

from trispec.engine.gpu.launch_count import launch

try:
    import triton
    import triton.language as tl
except ImportError:  # the eager CPU path never needs it
    triton = None


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


if triton is not None:

    @triton.jit(do_not_specialize=["num_rows"])  # one compiled kernel whatever the row count
    def _add_rms_norm(
        x_ptr, rows_ptr, delta_ptr, weight_ptr, res_ptr, out_ptr,
        stride_x, stride_delta, stride_res, stride_out, N, eps, num_rows,
        BLOCK: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_DELTA: tl.constexpr, HAS_WEIGHT: tl.constexpr,
        WRITE_RES: tl.constexpr,
    ):  # fmt: skip
        i = tl.program_id(0)
        r = i
        n = tl.arange(0, BLOCK)
        ok = n < N
        read = ok
        if HAS_ROWS:
            r = tl.load(rows_ptr + i)
            # a row outside x (a token id past the embedding table) reads nothing: a zero row, whose
            # norm is zero, where F.embedding would stop the device with an assert
            read = ok & (r >= 0) & (r < num_rows)
        s = tl.load(x_ptr + r * stride_x + n, mask=read, other=0.0).to(tl.float32)
        if HAS_DELTA:
            s += tl.load(delta_ptr + r * stride_delta + n, mask=read, other=0.0).to(tl.float32)
            # the residual stream is held in the model's dtype: normalise the value it holds
            s = s.to(res_ptr.dtype.element_ty).to(tl.float32)
        if WRITE_RES:
            tl.store(res_ptr + i * stride_res + n, s.to(res_ptr.dtype.element_ty), mask=ok)
        h = s * tl.rsqrt(tl.sum(s * s, axis=0) / N + eps)
        if HAS_WEIGHT:  # rounded first, as the unfused norm's output is
            h = h.to(out_ptr.dtype.element_ty).to(tl.float32)
            h = h * tl.load(weight_ptr + n, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + i * stride_out + n, h.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _bias_rope_write(
        qkv_ptr, bias_ptr, cos_ptr, sin_ptr, positions_ptr, slots_ptr, k_ptr, v_ptr,
        stride_row, stride_cos, stride_kh, stride_ks,
        H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, HAS_BIAS: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        position = tl.load(positions_ptr + row)
        slot = tl.load(slots_ptr + row)
        h = tl.arange(0, BLOCK_H)  # heads: q (H), k (KV), v (KV)
        d = tl.arange(0, D)
        rolled = (d + D // 2) % D  # rotate_half's partner of each lane (the sin table holds the sign)
        ok = (h < H + 2 * KV)[:, None]
        at = qkv_ptr + row * stride_row + h[:, None] * D
        x = tl.load(at + d[None, :], mask=ok, other=0.0).to(tl.float32)
        xr = tl.load(at + rolled[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            x += tl.load(bias_ptr + h[:, None] * D + d[None, :], mask=ok, other=0.0).to(tl.float32)
            xr += tl.load(bias_ptr + h[:, None] * D + rolled[None, :], mask=ok, other=0.0).to(tl.float32)
        cos = tl.load(cos_ptr + position * stride_cos + d).to(tl.float32)
        sin = tl.load(sin_ptr + position * stride_cos + d).to(tl.float32)
        # rounded where the unfused rope rounds (x * cos, then one addcmul): with bf16 inputs the same bits
        x = x.to(qkv_ptr.dtype.element_ty).to(tl.float32)
        xr = xr.to(qkv_ptr.dtype.element_ty).to(tl.float32)
        xc = (x * cos[None, :]).to(qkv_ptr.dtype.element_ty).to(tl.float32)
        y = tl.where((h < H + KV)[:, None], xc + xr * sin[None, :], x)
        # q, k, v back in place (the attention reads q from there), then k and v into the caches. A lane's
        # partner (rolled) may be held by another warp: every load of the row is done before any store
        tl.debug_barrier()
        tl.store(at + d[None, :], y.to(qkv_ptr.dtype.element_ty), mask=ok)
        is_k = ((h >= H) & (h < H + KV))[:, None]
        is_v = ((h >= H + KV) & (h < H + 2 * KV))[:, None]
        kv_head = tl.where(h >= H + KV, h - H - KV, tl.maximum(h - H, 0))
        cache = kv_head[:, None] * stride_kh + slot * stride_ks + d[None, :]
        tl.store(k_ptr + cache, y.to(k_ptr.dtype.element_ty), mask=is_k)
        tl.store(v_ptr + cache, y.to(v_ptr.dtype.element_ty), mask=is_v)

    @triton.jit
    def _silu_mul(gu_ptr, out_ptr, stride_gu, stride_out, N, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = n < N
        g = tl.load(gu_ptr + row * stride_gu + n, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * stride_gu + N + n, mask=ok, other=0.0).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded, as unfused
        tl.store(out_ptr + row * stride_out + n, (silu * u).to(out_ptr.dtype.element_ty), mask=ok)


def _need_triton() -> None:
    if triton is None:
        raise RuntimeError("the fused static step needs the triton package")


def add_rms_norm(
    x: torch.Tensor,
    eps: float,
    *,
    delta: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rms_norm(x[rows] + delta[rows]) * weight`` per row (``rows``: all of ``x`` when None;
    ``delta``/``weight`` optional; a row id outside ``x`` gives a zero row). With ``residual``,
    ``x[rows] + delta[rows]`` is also written there
    (row ``i`` of the result; ``residual`` may be ``x`` itself: each row is read before it is written).
    Rows of ``x``/``delta`` need a unit stride along the hidden size."""
    _need_triton()
    N = x.shape[-1]
    n = rows.shape[0] if rows is not None else x.shape[0]
    out = torch.empty(n, N, dtype=residual.dtype if residual is not None else x.dtype, device=x.device)
    block = triton.next_power_of_2(N)
    res = residual if residual is not None else out
    with launch("add_rms_norm"):
        _add_rms_norm[(n,)](
            x, rows if rows is not None else x, delta if delta is not None else x,
            weight if weight is not None else x, res, out,
            x.stride(0), delta.stride(0) if delta is not None else 0, res.stride(0), out.stride(0), N, eps,
            x.shape[0], BLOCK=block, HAS_ROWS=rows is not None, HAS_DELTA=delta is not None,
            HAS_WEIGHT=weight is not None, WRITE_RES=residual is not None, num_warps=_warps(block),
        )  # fmt: skip
    return out


def bias_rope_write(
    qkv: torch.Tensor,
    bias: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> None:
    """In place over ``qkv`` ``[T, (H + 2 KV) * D]`` (row stride free, columns contiguous): add
    ``bias``, rotate q and k at ``positions`` (tables ``[max_pos, D]``, the sin signed as in
    ``model.rope_tables``), and write k and v to ``slots`` of one layer's caches ``[KV, slots, D]``."""
    _need_triton()
    if head_dim & (head_dim - 1) or qkv.stride(1) != 1 or k_cache.stride(2) != 1:
        raise ValueError("head_dim must be a power of two, and the last dimensions contiguous")
    if k_cache.stride() != v_cache.stride() or cos.stride() != sin.stride():
        raise ValueError("the caches (and the rope tables) must share their strides")
    T = qkv.shape[0]
    block_h = triton.next_power_of_2(heads + 2 * kv_heads)
    with launch("bias_rope_write"):
        _bias_rope_write[(T,)](
            qkv, bias if bias is not None else qkv, cos, sin, positions, slots, k_cache, v_cache,
            qkv.stride(0), cos.stride(0), k_cache.stride(0), k_cache.stride(1),
            H=heads, KV=kv_heads, D=head_dim, BLOCK_H=block_h, HAS_BIAS=bias is not None,
            num_warps=_warps(block_h * head_dim),
        )  # fmt: skip


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``silu(gate_up[:, :N]) * gate_up[:, N:]`` for ``gate_up`` ``[T, 2N]``."""
    _need_triton()
    T, N = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(T, N, dtype=gate_up.dtype, device=gate_up.device)
    block = min(block, triton.next_power_of_2(N))
    with launch("silu_mul"):
        _silu_mul[(T, triton.cdiv(N, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), N, BLOCK=block, num_warps=_warps(block)
        )
    return out
