"""Paged attention for decode and verify as one Triton kernel: the GPU path's attention.

One program per (sequence, KV head[, split of the keys]): the grid depends on the padded batch
only, never on sequence lengths, so a CUDA graph captured once serves every length (lengths, query
counts and block tables are device tensors read inside the kernel). The ``G`` query heads of a KV
head and the sequence's ``Q`` query rows are packed into one ``BLOCK_M`` tile, so each key block is
read once for all of them (GQA 7 in Qwen2.5-0.5B/7B, 6 in 1.5B: not powers of two, hence the
padding to ``BLOCK_M`` and the row mask). Rows of sequence ``b`` are ``b * Q + j``; row ``j`` is at
position ``seq_len - q_len + j`` and sees keys ``0 ..`` that position (causal); rows ``j >= q_len``
are padding and get zeros. With ``splits > 1`` each program takes a slice of the keys and a second
kernel merges the partial softmaxes (batch 1 at long contexts would leave most SMs idle otherwise).

Under ``TRITON_INTERPRET=1`` (CI on CPU: set it before this module is imported) bf16 tiles are
multiplied as bit patterns by ``tl.dot``, so tests pass ``upcast=True`` (tiles go to fp32 first).
``static_attention.reference_paged_attention`` is the torch reference with the same arguments.
"""

from __future__ import annotations

import os

import torch

from trispec.engine.gpu.launch_count import launch

try:
    import triton
    import triton.language as tl
except ImportError:  # the eager CPU path never needs it
    triton = None


def available() -> bool:
    return triton is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _attend(
        q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, seq_lens_ptr, q_lens_ptr, part_ptr, stat_ptr,
        stride_qt, stride_qh, stride_kh, stride_ks, stride_ot, stride_bt, scale,
        G: tl.constexpr, Q: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, UPCAST: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + b)
        q_len = tl.load(q_lens_ptr + b)
        m = tl.arange(0, BLOCK_M)
        j = m // G  # query row of the sequence
        head = kvh * G + m % G
        real = m < Q * G
        row_ok = real & (j < q_len)
        pos = seq_len - q_len + j
        d = tl.arange(0, D)
        q = tl.load(
            q_ptr + (b * Q + j)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=row_ok[:, None],
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        # this program's keys: a BLOCK_N-aligned slice of [0, seq_len)
        chunk = tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N
        lo = split * chunk
        hi = tl.minimum(seq_len, lo + chunk)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            n_ok = n < hi
            block = tl.load(tables_ptr + b * stride_bt + n // BLOCK_SIZE, mask=n_ok, other=0)
            slot = block.to(tl.int64) * BLOCK_SIZE + n % BLOCK_SIZE
            kv_off = kvh * stride_kh + slot[:, None] * stride_ks + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=n_ok[:, None], other=0.0)
            v = tl.load(v_ptr + kv_off, mask=n_ok[:, None], other=0.0)
            if UPCAST:  # fp32 tiles at full precision, not tf32
                k = k.to(tl.float32)
                v = v.to(tl.float32)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(row_ok[:, None] & n_ok[None, :] & (n[None, :] <= pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if UPCAST:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SPLITS == 1:
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            out_off = (b * Q + j)[:, None] * stride_ot + head[:, None] * D + d[None, :]
            tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=real[:, None])
        else:
            base = ((b * tl.num_programs(1) + kvh) * SPLITS + split) * BLOCK_M
            tl.store(part_ptr + (base + m)[:, None] * D + d[None, :], acc)
            tl.store(stat_ptr + (base + m) * 2, m_i)
            tl.store(stat_ptr + (base + m) * 2 + 1, l_i)

    @triton.jit
    def _merge(
        out_ptr, part_ptr, stat_ptr, stride_ot,
        G: tl.constexpr, Q: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        m = tl.arange(0, BLOCK_M)
        d = tl.arange(0, D)
        base = (b * tl.num_programs(1) + kvh) * SPLITS * BLOCK_M
        m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        for s in tl.static_range(SPLITS):
            m_max = tl.maximum(m_max, tl.load(stat_ptr + (base + s * BLOCK_M + m) * 2))
        m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
        l_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for s in tl.static_range(SPLITS):
            row = base + s * BLOCK_M + m
            w = tl.exp(tl.load(stat_ptr + row * 2) - m_safe)
            l_sum += w * tl.load(stat_ptr + row * 2 + 1)
            acc += w[:, None] * tl.load(part_ptr + row[:, None] * D + d[None, :])
        o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
        j = m // G
        out_off = (b * Q + j)[:, None] * stride_ot + (kvh * G + m % G)[:, None] * D + d[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=(m < Q * G)[:, None])


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    block_size: int,
    scale: float,
    splits: int = 1,
    upcast: bool | None = None,
    block_n: int = 32,
) -> torch.Tensor:
    """``q`` ``[B * Q, H, D]`` (any row/head strides), ``k_cache``/``v_cache`` one layer's ``[KV,
    slots, D]``, ``block_tables`` int32 ``[B, max_blocks]``, ``seq_lens`` (keys after this step's
    writes) and ``q_lens`` int32 ``[B]``. Returns ``[B * Q, H * D]``; padding rows are zeros."""
    if triton is None:
        raise RuntimeError("the triton package is not installed")
    rows, H, D = q.shape
    B = block_tables.shape[0]
    KV = k_cache.shape[0]
    G, Q = H // KV, rows // B
    if D & (D - 1) or q.stride(2) != 1 or k_cache.stride(2) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("head_dim must be a power of two, and the last dimension contiguous")
    block_m = max(16, triton.next_power_of_2(Q * G))
    out = torch.empty(rows, H * D, dtype=q.dtype, device=q.device)
    if upcast is None:
        upcast = interpreting() or q.dtype == torch.float32
    part = stat = out  # not read with one split
    if splits > 1:
        part = torch.empty(B * KV * splits * block_m, D, dtype=torch.float32, device=q.device)
        stat = torch.empty(B * KV * splits * block_m, 2, dtype=torch.float32, device=q.device)
    with launch("attend"):
        _attend[(B, KV, splits)](
            q, k_cache, v_cache, out, block_tables, seq_lens, q_lens, part, stat,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0),
            block_tables.stride(0), scale, G=G, Q=Q, D=D, BLOCK_SIZE=block_size, BLOCK_M=block_m,
            BLOCK_N=block_n, SPLITS=splits, UPCAST=upcast,
        )  # fmt: skip
    if splits > 1:
        with launch("merge"):
            _merge[(B, KV)](out, part, stat, out.stride(0), G=G, Q=Q, D=D, BLOCK_M=block_m, SPLITS=splits)
    return out


def splits_for(batch: int, num_kv_heads: int, programs: int = 128) -> int:
    """Key splits that give about ``programs`` programs (an H100 has 132 SMs): a function of the
    padded batch only, so a captured graph keeps it."""
    splits = 1
    while batch * num_kv_heads * splits * 2 <= programs and splits < 16:
        splits *= 2
    return splits
