"""The ``kernels`` section of scripts/gpu_spec_bench.py: per model, the kernels one static step (batch
1, one row: the draft's decode; five rows: a verify, not in the tiny run) launches, unfused and
fused, and how many of them per decoder layer:

* ``counted``: what the step's code issues, counted on any device by ``engine/gpu/launch_count.py`` (the
  CPU run prints these);
* ``profiled`` (CUDA only): the kernels the torch profiler sees on the device for the same step, run
  eagerly (a graph replays exactly these), split per layer at the attention kernels. A failure of the
  step is its ``error``; one of the profiler only its ``profiler_error`` (the step itself ran).

And ``fused_check``, before any section runs the fused step: per model, one prefilled context, then a
step of 1 and of 5 rows at batch 1 and 8 on the fused and the unfused layers from the same KV; the
largest logit difference (and against the largest logit), NaNs, and how often their argmaxes agree.
Where the fused step raises, gives a NaN or is off by more than ``FUSED_TOLERANCE`` of the largest
logit, the run measures the unfused step.
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
    ctx = b.p.contexts[0]
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
    except Exception as e:  # the step's failure: a report, not a reason to lose the rest of the run
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    if b.cuda and "error" not in out:
        try:
            names = profiled(lambda: graphs.run(1))
            each, outside = per_layer(names, layers, marker="_attend")
            out.update(profiled=len(names), profiled_per_layer=each, profiled_outside=outside)
            out["profiled_layer_kernels"] = _layer_names(names)
        except Exception as e:  # the profiler's, not the step's
            out["profiler_error"] = f"{type(e).__name__}: {e}"[:300]
    engine.free(sid)
    return out


# of the largest logit: bf16 rounding, layer after layer, moves logits by a few hundredths of it, a
# wrong kernel by its order. An argmax that differs is a near-tie within twice the largest difference
# (each logit moved by at most that much), so the agreement is reported, not checked.
FUSED_TOLERANCE = 0.1


def fused_check(b: Any, engines: dict[str, TorchEngine]) -> None:
    """The fused step against the unfused one on the device, before any section uses it (see the
    module's docstring); a failure switches the run to the unfused step."""
    failures = []
    for name, engine in engines.items():
        try:
            row = _compare(b, engine)
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {e}"[:300]}
        bad = "error" in row or row["nan"] or row["max_rel_diff"] > FUSED_TOLERANCE
        b.emit(section="fused_check", model=name, ok=not bad, **row)
        if bad:
            failures.append(name)
    if failures:
        b.fused_failed = True
        if b.fused:
            b.fused = False
            b.emit(section="fused_step_failed", models=failures, step="unfused from here on")


def _compare(b: Any, engine: TorchEngine) -> dict[str, Any]:
    from trispec.engine.base import ForwardInput
    from trispec.engine.gpu.static_step import forward_static, static_attend
    from trispec.engine.gpu.triton_attention import splits_for

    g = torch.Generator().manual_seed(7)
    ctx = 200 if not b.tiny else 20
    worst, agree, rows, nan = 0.0, 0, 0, False
    scale = 0.0
    for batch in (1, 8) if not b.tiny else (1, 2):
        sids = list(range(980_000, 980_000 + batch))
        prompts = torch.randint(engine.vocab_size, (batch, ctx + 5), generator=g).tolist()
        try:
            for sid in sids:
                engine.add_sequence(sid, engine.max_context)
            engine.forward([ForwardInput(sid, p[:ctx], 0) for sid, p in zip(sids, prompts)])  # the context
            for q in (1, 5):
                for sid in sids:
                    engine.blocks.append(sid, q)
                seqs = [
                    SeqRows(p[ctx : ctx + q], ctx, engine.blocks.block_table(sid))
                    for sid, p in zip(sids, prompts)
                ]
                logits = {}
                for fused in (False, True):
                    # the run's graph sizes: the buffers (and kernel variants) its sections use
                    graphs = StepGraphs(engine, rows=q, logits=q, sizes=b.p.sizes, capture=False, fused=fused)
                    b_pad = graphs.stage(seqs)
                    graphs.upload()
                    sb = graphs.buffers.prefix(b_pad)
                    splits = (
                        splits_for(b_pad, engine.args.num_kv_heads) if graphs.attention == "triton" else 1
                    )
                    attend = static_attend(
                        sb, engine.block_size, engine.args.head_dim**-0.5, graphs.attention, splits
                    )
                    out = forward_static(engine.model, engine.kv, sb, attend, fused=fused)
                    logits[fused] = out[: batch * q].float()
                ref, out = logits[False], logits[True]
                nan = nan or bool(torch.isnan(out).any() or torch.isnan(ref).any())
                worst = max(worst, float((out - ref).abs().max()))
                scale = max(scale, float(ref.abs().max()))
                agree += int((out.argmax(-1) == ref.argmax(-1)).sum())
                rows += ref.shape[0]
                for sid in sids:
                    engine.truncate(sid, ctx)
        finally:
            for sid in sids:
                if sid in engine.blocks:
                    engine.free(sid)
    return {"max_abs_diff": round(worst, 5), "max_rel_diff": round(worst / max(scale, 1e-30), 5),
            "argmax_agree": round(agree / rows, 4), "rows": rows, "nan": nan}  # fmt: skip


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
