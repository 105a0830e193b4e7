"""The memory floor of CPU decoding (``specdec-bench``'s ``memory`` rows).

A 1-token decode step reads every weight once, so on a machine like the 2-core ones here its time is
bounded below by the bytes it reads over the memory's read bandwidth: the floor. The rows put every
decode figure of the run against it, measured in the same run (bandwidths differ between machines,
32-51 GB/s seen): per model the bytes a step reads (per layer kind and in all), the machine's read
bandwidth (``torch.sum`` over a buffer larger than any cache, the threads of the run), the floor, each
decode figure as a fraction of it (ours, llama.cpp's), and for ours the host time per token through the
scheduler: a token's time (the plain arm's inter-token latency at one request) minus the time its
forward spends in the model's kernel calls (``Transformer.kernel_clock``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trispec.engine.model import Transformer

if TYPE_CHECKING:
    from trispec.bench.harness import Bench
    from trispec.bench.llamacpp import Anchor

# larger than the L3 of any machine here (up to 300 MiB seen), small beside the 24 GiB of memory
PROBE_BYTES = 1 << 30
PROBE_REPS = 9


def read_bandwidth(reps: int = PROBE_REPS, nbytes: int | None = None) -> float:
    """Bytes per second ``torch.sum`` reads a buffer larger than the caches (median of ``reps``)."""
    nbytes = nbytes or PROBE_BYTES
    buffer = torch.ones(nbytes // 4)
    buffer.sum()  # pages touched, threads started
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def bytes_by_kind(model: Transformer) -> dict[str, int]:
    """Bytes a 1-token step reads from the weights, by layer kind (summed over the layers), the LM head,
    one embedding row, and ``total``."""

    def held(linear: Any) -> int:
        return sum(t.numel() * t.element_size() for t in linear.tensors())

    layer_kinds = ("qkv", "o", "gate_up", "down")
    kinds = {kind: sum(held(getattr(layer, kind)) for layer in model.layers) for kind in layer_kinds}
    norms = [n for layer in model.layers for n in (layer.attn_norm, layer.mlp_norm) if n is not None]
    kinds["norms"] = sum(n.numel() * n.element_size() for n in (*norms, model.norm))
    kinds["lm_head"] = held(model.lm_head)
    kinds["embed_row"] = embed_row_bytes(model)
    kinds["total"] = sum(kinds.values())
    return kinds


def embed_row_bytes(model: Transformer) -> int:
    """Bytes of one embedding row as stored (a GGUF row's blocks, an int8 row and its scale)."""
    if model.embed_blocks is not None:
        return int(model.embed_blocks.data.shape[1])
    scale = 0 if model.embed_scales is None else model.embed_scales.element_size()
    return model.embed.shape[1] * model.embed.element_size() + scale


@dataclass
class DecodeFigure:
    """One decode speed of the run (tokens per second of one request), and what it stands for."""

    name: str
    tok_s: float

    def against(self, floor_s: float) -> dict[str, float]:
        return {
            "tok_s": round(self.tok_s, 3),
            "ms": round(1e3 / self.tok_s, 3),
            "of_floor": round(floor_s * self.tok_s, 4),  # floor time / token time
        }


def host_ms_per_token(itl_s: list[float], forwards: list[tuple[int, float]]) -> dict[str, float] | None:
    """A token's time through the scheduler minus its kernels': the mean inter-token latency of a
    one-request plain run less the mean kernel time of its 1-row forwards (its decode steps)."""
    decode = [seconds for rows, seconds in forwards if rows == 1]
    if not itl_s or not decode:
        return None
    token, kernels = statistics.fmean(itl_s), statistics.fmean(decode)
    return {
        "token_ms": round(token * 1e3, 3),
        "kernel_ms": round(kernels * 1e3, 3),
        "host_ms": round((token - kernels) * 1e3, 3),
    }


def memory_row(
    role: str,
    model: Transformer,
    bandwidth: float,
    figures: list[DecodeFigure],
    host: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The ``memory`` row of one model: its bytes, the floor at ``bandwidth`` and every figure against it."""
    kinds = bytes_by_kind(model)
    floor_s = kinds["total"] / bandwidth
    row: dict[str, Any] = {
        "row": "memory",
        "role": role,
        "bytes": kinds,
        "read_gb_s": round(bandwidth / 1e9, 2),
        "floor_ms": round(floor_s * 1e3, 3),
        "floor_tok_s": round(1 / floor_s, 3),
        "figures": {f.name: f.against(floor_s) for f in figures},
    }
    if host is not None:
        row["host"] = host
    return row


STEP_REPS = 30


def memory_rows(bench: Bench, rows: list[dict[str, Any]], anchors: dict[str, Anchor]) -> list[dict[str, Any]]:
    """A ``memory`` row for the target and each draft model of the sweep: the machine's read bandwidth
    measured now; against it the engine's 1-token step (median, the models interleaved), every arm's
    decode speed at one request (``decode_tok_s``, first token out), llama.cpp's tg where anchored, and
    the plain arm's host time per token."""
    from trispec.bench.engine import StepTimer, interleaved_medians

    engines = {"target": bench.target}
    for name in dict.fromkeys(r["drafter"] for r in rows if r.get("drafter")):
        draft = bench.drafters.engine(name) if name != "hf" else None
        if draft is not None and draft not in engines.values():
            engines[f"draft {name.removesuffix('+suffix')}"] = draft
    context = list(range(100, 164))
    timers = {role: StepTimer(e, context, 4, 4_000_000) for role, e in engines.items()}
    try:
        steps = interleaved_medians({role: t.step(1) for role, t in timers.items()}, STEP_REPS, 5)
    finally:
        for timer in timers.values():
            timer.close()
    bandwidth = read_bandwidth()
    out = []
    for role, engine in engines.items():
        figures = [DecodeFigure("engine_step", 1 / steps[role])]
        host = None
        if role == "target":
            for r in rows:
                if r["concurrency"] == 1 and r.get("decode_tok_s") and r["workload"] != "all":
                    figures.append(DecodeFigure(f"{r['workload']}/{r['arm']}", r["decode_tok_s"]))
                if r["concurrency"] == 1 and r.get("host"):
                    host = {**(host or {}), r["workload"]: r["host"]}
        anchor = {"target": anchors.get("target"), "draft model": anchors.get("draft")}.get(role)
        if anchor is not None:
            figures.append(DecodeFigure(f"llamacpp_tg{anchor.n_gen}", anchor.decode_tok_s))
        out.append(memory_row(role, engine.model, bandwidth, figures, host))
    return out
