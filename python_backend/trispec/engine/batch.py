"""The packed ragged batch: the new tokens of many sequences in one ``[T]`` vector, and what every
layer of one forward needs (positions for RoPE, cache slots to write, the attention plan, which rows
get logits). Computed once per forward and shared by all layers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trispec.engine.attention import Attention, SeqRows
from trispec.engine.cpu.host_ints import host_ints
from trispec.engine.kv_cache import slots_of


@dataclass
class Batch:
    tokens: torch.Tensor  # [T] packed new tokens (sequences grouped by new-token count)
    positions: torch.Tensor  # [T] each token's position (RoPE)
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


def pack(
    seqs: Sequence[SeqSpec],
    block_size: int,
    *,
    device: torch.device,
    attention: Attention,
    dtype: torch.dtype,
) -> tuple[Batch, list[tuple[int, int]]]:
    """Pack ``seqs`` (grouped by new-token count: equal counts are neighbours) for a model on
    ``device`` with its attention backend.

    Returns the batch and, for each input sequence in order, ``(first_logit_row, num_logits)`` into
    the logits that the forward returns.
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
        positions.extend(range(s.start, s.start + n))
        slots.extend(slots_of(table, block_size, range(s.start, s.start + n)))
        if n:
            rows.append(SeqRows(t0, n, s.start, table))

    def index(values: list[int]) -> torch.Tensor:
        if device.type == "cpu":
            return host_ints(values)
        # staged in pinned host memory, copied without blocking the host
        return torch.tensor(values, dtype=torch.long).pin_memory().to(device, non_blocking=True)

    lr: torch.Tensor | slice
    if not logit_rows or logit_rows == list(range(logit_rows[0], logit_rows[0] + len(logit_rows))):
        first = logit_rows[0] if logit_rows else 0
        lr = slice(first, first + len(logit_rows))  # a view, no gather
    else:
        lr = index(logit_rows)
    batch = Batch(
        tokens=index(tokens),
        positions=index(positions),
        slots=index(slots),
        attn=attention.plan(rows, block_size, dtype),
        logit_rows=lr,
    )
    return batch, logit_span
