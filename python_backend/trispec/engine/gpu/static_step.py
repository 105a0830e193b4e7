"""The static, sync-free step: one forward whose every input and output is a preallocated device
buffer (``StaticBatch``), so it can be captured in a CUDA graph and replayed for any lengths.

Layout: ``B`` sequences of ``Q`` rows each; row ``b * Q + j`` is sequence ``b``'s ``j``-th new token.
A sequence feeds ``q_lens[b]`` tokens (0: a padding sequence); its rows past that are padding and
write their keys/values to the engine's trash slot. ``seq_lens[b]`` counts its keys after this
step's writes. The step reads the model's head only for ``logit_rows`` and keeps the argmax on the
device (``out_tokens``); nothing in it calls ``.item()``/``.tolist()``/``.cpu()`` or takes a shape
from a value (``tests/test_static_step.py`` checks that under ``torch.compile(fullgraph=True)``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from trispec.engine.gpu.static_attention import reference_paged_attention
from trispec.engine.kv_cache import KVCache
from trispec.engine.model import Attend, Transformer, rms_norm


@dataclass
class StaticBatch:
    tokens: torch.Tensor  # int64 [B * Q]
    positions: torch.Tensor  # int64 [B * Q]
    slots: torch.Tensor  # int64 [B * Q]: cache slot of each row (padding: the trash slot)
    logit_rows: torch.Tensor  # int64 [B * R]: rows the head runs on, R per sequence
    block_tables: torch.Tensor  # int32 [B, max_blocks] (padding entries: the trash block)
    seq_lens: torch.Tensor  # int32 [B]
    q_lens: torch.Tensor  # int32 [B]
    out_tokens: torch.Tensor  # int64 [B, R]: argmax of each logit row
    rows_per_seq: int
    flat64: torch.Tensor | None = None  # the int64 inputs as one buffer: one copy uploads them
    flat32: torch.Tensor | None = None  # the int32 inputs as one buffer

    @classmethod
    def allocate(
        cls,
        batch: int,
        rows_per_seq: int,
        logits_per_seq: int,
        max_blocks: int,
        device: torch.device,
        *,
        pin: bool = False,
        out_tokens: torch.Tensor | None = None,
    ) -> StaticBatch:
        n, r = batch * rows_per_seq, batch * logits_per_seq
        flat64 = torch.zeros(3 * n + r, dtype=torch.int64, device=device, pin_memory=pin)
        flat32 = torch.zeros(batch * (max_blocks + 2), dtype=torch.int32, device=device, pin_memory=pin)
        if out_tokens is None:
            out_tokens = torch.zeros(batch, logits_per_seq, dtype=torch.int64, device=device)
        return cls(
            tokens=flat64[:n],
            positions=flat64[n : 2 * n],
            slots=flat64[2 * n : 3 * n],
            logit_rows=flat64[3 * n :],
            block_tables=flat32[: batch * max_blocks].view(batch, max_blocks),
            seq_lens=flat32[batch * max_blocks : batch * (max_blocks + 1)],
            q_lens=flat32[batch * (max_blocks + 1) :],
            out_tokens=out_tokens,
            rows_per_seq=rows_per_seq,
            flat64=flat64,
            flat32=flat32,
        )

    @property
    def batch(self) -> int:
        return self.block_tables.shape[0]

    def prefix(self, batch: int) -> StaticBatch:
        """Views of the first ``batch`` sequences (a smaller graph's inputs inside the same buffers)."""
        n, r = batch * self.rows_per_seq, batch * self.out_tokens.shape[1]
        return StaticBatch(
            tokens=self.tokens[:n],
            positions=self.positions[:n],
            slots=self.slots[:n],
            logit_rows=self.logit_rows[:r],
            block_tables=self.block_tables[:batch],
            seq_lens=self.seq_lens[:batch],
            q_lens=self.q_lens[:batch],
            out_tokens=self.out_tokens[:batch],
            rows_per_seq=self.rows_per_seq,
        )

    def upload(self, host: StaticBatch) -> None:
        """Copy every input from ``host`` (same layout, pinned memory on a GPU machine): two copies
        that do not block the host."""
        assert self.flat64 is not None and self.flat32 is not None
        assert host.flat64 is not None and host.flat32 is not None
        self.flat64.copy_(host.flat64, non_blocking=True)
        self.flat32.copy_(host.flat32, non_blocking=True)


# The GPU path's default step. Unfused until the H100 run measures the fused step faster (its
# kernels are checked on the CPU under the Triton interpreter only); docs/gpu.md.
FUSED_DEFAULT = False


def forward_static(
    model: Transformer, kv: KVCache, sb: StaticBatch, attend: Attend, *, fused: bool = False
) -> torch.Tensor:
    """Run ``sb`` through ``model``: write its keys/values, put the argmax of each logit row in
    ``sb.out_tokens`` and return those rows' logits (model dtype, on the device). ``fused``: the
    layers of ``fused_step.py`` (Triton kernels: CUDA, or the CPU under ``TRITON_INTERPRET=1``)."""
    if fused:
        from trispec.engine.gpu.fused_step import forward_fused

        x = forward_fused(model, kv, sb.tokens, sb.positions, sb.slots, sb.logit_rows, attend)
    else:
        x = model.embed_tokens(sb.tokens)
        cos = model.cos.index_select(0, sb.positions).unsqueeze(1)
        sin = model.sin.index_select(0, sb.positions).unsqueeze(1)
        x = model.run_layers(x, cos, sin, sb.slots, kv, attend)
        x = rms_norm(x.index_select(0, sb.logit_rows), model.args.rms_norm_eps) * model.norm
    logits = model.full_vocab(model.lm_head(x))
    if fused and sb.out_tokens.is_contiguous():  # the argmax straight into its buffer: one kernel
        torch.argmax(logits, dim=-1, out=sb.out_tokens.view(-1))
    else:
        sb.out_tokens.copy_(logits.argmax(dim=-1).view(sb.out_tokens.shape))
    return logits


def static_attend(sb: StaticBatch, block_size: int, scale: float, kind: str, splits: int = 1) -> Attend:
    """Attention over ``sb``'s block tables and lengths: ``triton`` (the GPU kernel) or ``torch``
    (the reference; any device, static shapes)."""
    meta = (sb.block_tables, sb.seq_lens, sb.q_lens)
    if kind == "triton":
        from trispec.engine.gpu.triton_attention import paged_attention

        kernel = functools.partial(paged_attention, block_size=block_size, scale=scale, splits=splits)
    elif kind == "torch":
        kernel = functools.partial(reference_paged_attention, block_size=block_size, scale=scale)
    else:
        raise ValueError(f"unknown static attention {kind!r} (triton, torch)")

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor):
        return kernel(q, kc, vc, *meta)

    return attend
