"""The ``kernels`` section of scripts/gpu_spec_bench.py: per model, the kernels one static step (batch
1, one row: the draft's decode; five rows: a verify, not in the tiny run) launches, unfused and
fused, and how many of them per decoder layer:

* ``counted``: what the step's code issues, counted on any device by ``engine/gpu/launch_count.py`` (the
  CPU run prints these);
* ``profiled`` (CUDA only): the kernels the torch profiler sees on the device for the same step, run
  eagerly (a graph replays exactly these), split per layer at the attention kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs
from trispec.engine.gpu.launch_count import LaunchCounter, per_layer
from trispec.engine.torch_engine import TorchEngine


def kernels_section(b: Any, engines: dict[str, TorchEngine]) -> None:
    for name, engine in engines.items():
        for rows in (1,) if b.tiny else (1, 5):  # tiny: interpreted kernels, each code path once
            if not b.time_left(10):
                b.emit(section="kernels", model=name, rows=rows, skipped="time budget")
                continue
            for fused in (False, True):
                b.emit(section="kernels", model=name, rows=rows, fused=fused, **_one(b, engine, rows, fused))


def _one(b: Any, engine: TorchEngine, rows: int, fused: bool) -> dict[str, Any]:
    graphs = StepGraphs(
        engine, rows=rows, logits=rows, sizes=(1,), capture=False, attention="triton", fused=fused
    )
    sid = 990_000
    engine.add_sequence(sid, engine.max_context)
    ctx = b.contexts[0]
    engine.blocks.append(sid, ctx + rows)
    graphs.stage([SeqRows([7] * rows, ctx, engine.blocks.block_table(sid))])
    graphs.upload()
    layers = engine.args.num_layers
    out: dict[str, Any] = {}
    try:
        if b.cuda:
            graphs.run(1)  # compiles the kernels outside what is counted
            b.sync()
        with torch.inference_mode(), LaunchCounter() as counter:
            graphs.run(1)
        each, outside = per_layer(counter.names, layers)
        out.update(counted=len(counter.names), counted_per_layer=each, counted_outside=outside)
        if b.cuda:
            names = profiled(lambda: graphs.run(1))
            each, outside = per_layer(names, layers, marker="_attend")
            out.update(profiled=len(names), profiled_per_layer=each, profiled_outside=outside)
            out["profiled_layer_kernels"] = _layer_names(names)
    except Exception as e:  # a report, not a reason to lose the rest of the run
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        engine.free(sid)
    return out


def profiled(fn: Callable[[], None]) -> list[str]:
    """Names of the device events (kernels, memsets, copies) ``fn`` causes, in start order."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [e.name for e in events]


def _layer_names(names: list[str]) -> list[str]:
    """One layer's kernels (from the first attention kernel to the next), names cut short."""
    at = [i for i, n in enumerate(names) if "_attend" in n]
    return [n[:60] for n in names[at[0] : at[1]]] if len(at) > 1 else []
