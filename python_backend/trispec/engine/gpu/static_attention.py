"""Paged attention over static-shape device metadata, in torch: the reference for the Triton kernel
(``triton_attention.paged_attention``, same arguments) and the static step's attention on CPU.

Every shape is fixed by the padded batch and the block-table width (each sequence's keys are
gathered through its whole table row and masked by its length), so it runs under
``torch.compile(fullgraph=True)`` and in a CUDA graph alike; it costs a gather of
``max_blocks * block_size`` keys per sequence, which is why the GPU uses the kernel.
"""

from __future__ import annotations

import torch


def reference_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    q_lens: torch.Tensor,
    *,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """``q`` ``[B * Q, H, D]``; caches ``[KV, slots, D]``; ``block_tables`` ``[B, max_blocks]``;
    ``seq_lens``/``q_lens`` ``[B]``. Row ``b * Q + j`` sits at position ``seq_len - q_len + j``;
    rows ``j >= q_len`` are padding and get zeros. Computed in float32, returned in ``q``'s dtype."""
    rows, H, D = q.shape
    B, max_blocks = block_tables.shape
    KV = k_cache.shape[0]
    G, Q, L = H // KV, rows // B, max_blocks * block_size
    offsets = torch.arange(block_size, device=q.device)
    slots = (block_tables.long()[:, :, None] * block_size + offsets).view(B * L)
    keys = k_cache.index_select(1, slots).view(KV, B, L, D).transpose(0, 1).float()
    values = v_cache.index_select(1, slots).view(KV, B, L, D).transpose(0, 1).float()
    j = torch.arange(Q, device=q.device)
    pos = (seq_lens - q_lens).long()[:, None] + j  # [B, Q]
    t = torch.arange(L, device=q.device)
    allowed = (t <= pos[:, :, None]) & (j < q_lens[:, None])[:, :, None]  # [B, Q, L]; t <= pos < seq_len
    qs = q.view(B, Q, KV, G, D).permute(0, 2, 3, 1, 4).float()  # [B, KV, G, Q, D]
    scores = torch.einsum("bkgqd,bkld->bkgql", qs, keys) * scale
    # a finite fill: a row with no key (padding) stays NaN-free and is zeroed below
    scores = scores.masked_fill(~allowed[:, None, None], -1e30)
    probs = torch.softmax(scores, dim=-1) * allowed[:, None, None].any(-1, keepdim=True)
    out = torch.einsum("bkgql,bkld->bkgqd", probs, values)  # [B, KV, G, Q, D]
    return out.permute(0, 3, 1, 2, 4).reshape(rows, H * D).to(q.dtype)
