"""``StepGraphs``: one engine's static step (``static_step.py``) at one shape, for every padded batch
size: the device buffers, their pinned host staging copy, and a CUDA graph per size, captured on
first use. With ``capture=False`` the same step runs eagerly on the same buffers (the CPU tests).

Per round the host writes every input (tokens, positions, slots, block-table rows, lengths) into the
staging copy, padding rows pointing at the engine's trash block; one ``upload`` moves them; a replay
runs the step. Graphs embed no length, table or position: all of them are buffer contents, so the
``BlockManager`` stays the single source of truth and rollback stays host bookkeeping.

A step may also choose its tokens by the coupled sampling rule on the device
(``sampling/graph_sampler.py``): one graph per padded size and ``SamplerMode``, the greedy one being
the plain step. The per-row sampling settings are staged and uploaded like the other inputs.

Graphs of all sets share one memory pool (``GraphPool``): safe because each graph's results land in
buffers allocated outside capture and replays run one after another on one stream. Sizes are
captured on first use; ``pool_bytes`` counts what the captures took from the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trispec.engine.gpu.static_step import FUSED_DEFAULT, StaticBatch, forward_static, static_attend
from trispec.engine.gpu.triton_attention import splits_for
from trispec.engine.kv_cache import blocks_for, slots_of
from trispec.engine.torch_engine import TorchEngine
from trispec.sampling.graph_sampler import GREEDY, SamplerMode, SamplingRows, choose_tokens
from trispec.sampling_params import SamplingParams

# past 32, steps of 32: at most 31 padding sequences; a larger batch runs as parts of the largest
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 64, 96, 128, 160, 192, 224, 256)


def padded_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds ``n`` sequences (None: more than the largest)."""
    return next((s for s in sorted(sizes) if s >= n), None)


@dataclass(frozen=True)
class SeqRows:
    """One sequence's rows of a step: ``tokens`` fed at positions ``start ..`` through ``table``."""

    tokens: Sequence[int]
    start: int
    table: Sequence[int]


class GraphPool:
    """The memory pool all captures share (set by the first capture), and the device memory the
    captures took from it (the growth of reserved memory over each capture)."""

    handle: object = None
    bytes: int = 0


class StepGraphs:
    def __init__(
        self,
        engine: TorchEngine,
        *,
        rows: int,
        logits: int,
        sizes: Sequence[int] = GRAPH_BATCH_SIZES,
        capture: bool = True,
        attention: str | None = None,
        out_tokens: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        prologue: Callable[[StaticBatch], None] | None = None,
        pool: GraphPool | None = None,
        sampling: SamplingRows | None = None,
        out_log_probs: torch.Tensor | None = None,
        advance_noise: bool = False,
        flag_unfit: bool = False,
        argmax_kernel: str | None = None,
        fused: bool | None = None,
    ) -> None:
        """``rows`` per sequence; ``logits`` rows per sequence get the head (``rows``: all, 1: the
        last fed one). ``prologue`` runs on the device before the step, inside its graph.
        ``out_tokens``/``block_tables``/``sampling``: buffers shared with another set (the draft's two
        steps). Sampled modes: ``out_log_probs`` (int64 ``[B, logits]``, float64 bits) takes the
        log-probabilities, ``advance_noise`` moves each row's noise position on by one before the step
        (the draft's next step), ``flag_unfit`` marks a row whose kept set does not fit with -1.
        ``fused``: the step's layers as fused Triton kernels (``fused_step.py``); None: ``FUSED_DEFAULT``."""
        if logits not in (1, rows):
            raise ValueError("logits per sequence: 1 (the last fed row) or all rows")
        self.engine, self.rows, self.logits = engine, rows, logits
        self.sizes = tuple(sorted(sizes))
        device = engine.kv.k.device
        self.capture = capture and device.type == "cuda"
        self.attention = attention or ("triton" if device.type == "cuda" else "torch")
        self.max_blocks = blocks_for(engine.max_context, engine.block_size)
        self.trash_slot = engine.trash_block * engine.block_size
        B = self.sizes[-1]
        self.buffers = StaticBatch.allocate(B, rows, logits, self.max_blocks, device, out_tokens=out_tokens)
        if block_tables is not None:
            self.buffers.block_tables = block_tables
        self.host = StaticBatch.allocate(
            B, rows, logits, self.max_blocks, torch.device("cpu"), pin=self.capture
        )
        self._np = {name: getattr(self.host, name).numpy() for name in _FIELDS}
        self.prologue = prologue
        self.pool = pool or GraphPool()
        R = B * logits
        self.sampling = sampling if sampling is not None else SamplingRows.allocate(R, device)
        self.host_sampling = SamplingRows.allocate(R, torch.device("cpu"), pin=self.capture)
        self.out_log_probs = out_log_probs
        self.advance_noise, self.flag_unfit = advance_noise, flag_unfit
        self.argmax_kernel = argmax_kernel or ("triton" if device.type == "cuda" else "c")
        self.fused = FUSED_DEFAULT if fused is None else fused
        self._graphs: dict[tuple[int, SamplerMode], torch.cuda.CUDAGraph] = {}
        self._views: dict[int, tuple[StaticBatch, Callable]] = {}
        self._pad_host(B)
        self.buffers.upload(self.host)

    # -- host side ----------------------------------------------------------------------------
    def stage(self, seqs: Sequence[SeqRows]) -> int:
        """Write ``seqs`` (at most ``rows`` tokens each) and padding up to the padded size into the
        staging copy; returns that size. Block-table rows are rewritten whole every time: a table
        cut back by rollback, or blocks freed and handed to another sequence, never linger."""
        b_pad = padded_size(len(seqs), self.sizes)
        if b_pad is None:
            raise ValueError(f"{len(seqs)} sequences exceed the largest graph ({self.sizes[-1]})")
        self._pad_host(b_pad)
        a, Q, BS = self._np, self.rows, self.engine.block_size
        for b, s in enumerate(seqs):
            n = len(s.tokens)
            if n > Q or len(s.table) > self.max_blocks:
                raise ValueError(f"sequence {b}: {n} rows or {len(s.table)} blocks exceed the static shape")
            r = slice(b * Q, b * Q + n)
            a["tokens"][r] = s.tokens
            a["positions"][b * Q : (b + 1) * Q] = s.start + min(n, 1) * np.minimum(np.arange(Q), n - 1)
            a["slots"][r] = slots_of(s.table, BS, range(s.start, s.start + n))
            a["block_tables"][b, : len(s.table)] = s.table
            a["seq_lens"][b], a["q_lens"][b] = s.start + n, n
            if self.logits == 1:
                a["logit_rows"][b] = b * Q + max(n - 1, 0)
        return b_pad

    def stage_sampling(self, seqs: Sequence[tuple[SamplingParams, int] | None]) -> None:
        """Each sequence's sampling settings and the output position of its first logit row
        (``SamplingRows.stage``)."""
        self.host_sampling.stage(seqs, self.logits)

    def stage_positions(self, positions: Sequence[int | None]) -> int:
        """For a step whose prologue computes its inputs (``advance_one``): each sequence's last
        fed position, None for one that does not take part; returns the padded size."""
        b_pad = padded_size(len(positions), self.sizes)
        if b_pad is None:
            raise ValueError(f"{len(positions)} sequences exceed the largest graph ({self.sizes[-1]})")
        self._pad_host(b_pad)
        a = self._np
        for b, p in enumerate(positions):
            if p is not None:
                a["positions"][b], a["q_lens"][b] = p, 1
        return b_pad

    def _pad_host(self, b_pad: int) -> None:
        a, Q = self._np, self.rows
        a["tokens"][: b_pad * Q] = 0
        a["positions"][: b_pad * Q] = 0
        a["slots"][: b_pad * Q] = self.trash_slot
        a["block_tables"][:b_pad] = self.engine.trash_block
        a["seq_lens"][:b_pad] = 0
        a["q_lens"][:b_pad] = 0
        n = b_pad * self.logits
        a["logit_rows"][:n] = np.arange(n) if self.logits == Q else np.arange(b_pad) * Q

    def upload(self, sampling: bool = False) -> None:
        self.buffers.upload(self.host)
        if sampling:
            self.sampling.upload(self.host_sampling)

    # -- device side --------------------------------------------------------------------------
    def run(self, b_pad: int, mode: SamplerMode = GREEDY) -> None:
        """One step over the first ``b_pad`` sequences of the buffers (a replay when captured)."""
        if not self.capture:
            self._step(b_pad, mode)
            return
        graph = self._graphs.get((b_pad, mode))
        if graph is None:
            raise RuntimeError(f"batch size {b_pad} ({mode}) is not captured: call ensure_captured first")
        graph.replay()

    def ensure_captured(self, b_pad: int, mode: SamplerMode = GREEDY) -> None:
        """Capture the graph for ``b_pad`` and ``mode`` (before staging: the warm-up runs on
        all-padding inputs, so it writes only to the trash block, and leaves them so)."""
        if not self.capture or (b_pad, mode) in self._graphs:
            return
        self._pad_host(self.sizes[-1])
        self.host_sampling.pad(self.host_sampling.sampled.shape[0])
        self.upload(sampling=not mode.greedy)
        reserved = torch.cuda.memory_reserved()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: compiles the kernels outside the capture
            self._step(b_pad, mode)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool.handle):
            self._step(b_pad, mode)
        self.pool.handle = graph.pool()
        self.pool.bytes += torch.cuda.memory_reserved() - reserved
        self._graphs[(b_pad, mode)] = graph

    def _step(self, b_pad: int, mode: SamplerMode = GREEDY) -> None:
        if b_pad not in self._views:
            sb = self.buffers.prefix(b_pad)
            args = self.engine.args
            splits = splits_for(b_pad, args.num_kv_heads) if self.attention == "triton" else 1
            attend = static_attend(sb, self.engine.block_size, args.head_dim**-0.5, self.attention, splits)
            self._views[b_pad] = (sb, attend)
        sb, attend = self._views[b_pad]
        if self.prologue is not None:
            self.prologue(sb)
        rows = self.sampling.prefix(b_pad * self.logits)
        if mode.noise and self.advance_noise:  # one logit row per sequence
            rows.positions.add_((sb.q_lens > 0).long())
        logits = forward_static(self.engine.model, self.engine.kv, sb, attend, fused=self.fused)
        if mode.greedy:
            return
        tokens, log_probs = choose_tokens(
            logits,
            sb.out_tokens.reshape(-1),
            rows,
            mode,
            flag_unfit=self.flag_unfit,
            kernel=self.argmax_kernel,
        )
        if mode.noise:  # else the argmax, already there
            sb.out_tokens.copy_(tokens.view(sb.out_tokens.shape))
        if log_probs is not None and self.out_log_probs is not None:
            self.out_log_probs[:b_pad].copy_(log_probs.view(torch.int64).view(b_pad, self.logits))


_FIELDS = ("tokens", "positions", "slots", "logit_rows", "block_tables", "seq_lens", "q_lens")


def advance_one(block_size: int, trash_slot: int) -> Callable[[StaticBatch], None]:
    """The prologue of a draft's next step (one row per sequence), all on the device: feed the
    previous step's argmax (``out_tokens``, shared with the first step) one position further,
    through the block table (shared too; blocks for every draft position were reserved before the
    replays). The host stages each sequence's last fed position and ``q_lens`` 1 (0: padding,
    which writes to the trash slot); each replay advances the positions in place."""

    def prologue(sb: StaticBatch) -> None:
        active = sb.q_lens > 0
        sb.positions.add_(active.long())
        sb.tokens.copy_(sb.out_tokens[:, 0])
        sb.seq_lens.copy_((sb.positions + 1) * active)
        block = sb.block_tables.gather(1, (sb.positions // block_size)[:, None])[:, 0].long()
        slot = block * block_size + sb.positions % block_size
        sb.slots.copy_(torch.where(active, slot, torch.full_like(slot, trash_slot)))

    return prologue
