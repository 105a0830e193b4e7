"""The device sections of scripts/gpu_spec_bench.py that time single steps: the copy-bandwidth
ceiling, the Triton attention kernel against an fp32 reference, the static step's costs (graph
replay and eager) with their ratios, and the device sampler per mode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from gpu_bench_plan import KERNEL_CASES, KERNEL_TIME_HEADS, QWEN
from trispec.engine.base import ForwardInput
from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs
from trispec.engine.gpu.static_attention import reference_paged_attention
from trispec.engine.torch_engine import TorchEngine
from trispec.sampling_params import SamplingParams

BS = 16


def copy_ceiling(b: Any) -> float:
    n = (1 << 20) if b.tiny else (1 << 29)  # bf16 elements: 1 GiB on the GPU
    src = torch.empty(n, dtype=torch.bfloat16, device=b.device)
    dst = torch.empty_like(src)
    seconds = b.timed(lambda: dst.copy_(src), iters=5 if b.tiny else 20, warmup=2)
    gbs = 2 * src.nbytes / seconds / 1e9  # read + write
    b.emit(section="copy", gb_per_s=round(gbs, 1))
    return gbs


def kernel_cases(tiny: bool, batches: tuple[int, ...], contexts: tuple[int, ...]) -> Iterator[tuple]:
    """(kind, heads, KV heads, lengths, rows, splits) of every kernel-check launch: the error cases
    (ragged lengths, GQA 7 and 6, 1 and 5 rows; tiny, interpreted: each code path once), then the
    timed ones (the 7B's heads, one row, ``splits_for`` of the batch)."""
    from trispec.engine.gpu.triton_attention import splits_for

    lengths = [0, 1, 16, 17, 40 if tiny else 500]
    for heads, kv_heads, q in KERNEL_CASES:
        for splits in (1,) if tiny and q > 1 else (1, 4):
            yield "error", heads, kv_heads, lengths, q, splits
    heads, kv_heads = KERNEL_TIME_HEADS
    for batch in batches[:1] if tiny else batches:
        for ctx in contexts:
            yield "time", heads, kv_heads, [ctx] * batch, 1, splits_for(batch, kv_heads)


def kernel_check(b: Any) -> None:
    from trispec.engine.gpu.triton_attention import paged_attention

    D = 16 if b.tiny else 128
    g = torch.Generator(device=b.device).manual_seed(0)
    for kind, heads, kv_heads, lengths, q, splits in kernel_cases(b.tiny, b.p.batches, b.p.contexts):
        case = kernel_case(b.device, b.dtype, heads, kv_heads, lengths, q, D, g)
        if kind == "error":
            out = paged_attention(*case, block_size=BS, scale=D**-0.5, splits=splits)
            ref = reference_paged_attention(
                case[0].float(), case[1].float(), case[2].float(), *case[3:], block_size=BS, scale=D**-0.5
            )
            err = ((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
            b.emit(section="kernel_error", gqa=heads // kv_heads, q=q, splits=splits, max_rel_err=err)
        else:
            ms = b.timed(lambda c=case, s=splits: paged_attention(*c, block_size=BS, scale=D**-0.5, splits=s),
                         iters=1 if b.tiny else 50, warmup=0 if b.tiny else 2) * 1e3  # fmt: skip
            b.emit(section="kernel_time", batch=len(lengths), ctx=lengths[0], splits=splits, ms=round(ms, 4))


def kernel_check_launches(tiny: bool) -> list[Any]:
    """The kernel check's launches, recorded on the meta device (``runners/graph_aot.py``)."""
    from gpu_bench_plan import Points
    from trispec.engine.gpu.triton_attention import paged_attention
    from trispec.runners.graph_aot import recording

    p, D, meta = Points.of(tiny), 16 if tiny else 128, torch.device("meta")
    with recording() as launches:
        for _, heads, kv_heads, lengths, q, splits in kernel_cases(tiny, p.batches, p.contexts):
            case = kernel_case(meta, torch.bfloat16, heads, kv_heads, lengths, q, D, None)
            paged_attention(*case, block_size=BS, scale=D**-0.5, splits=splits)
    return launches


def kernel_case(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, lengths: list[int],
                q: int, D: int, g: torch.Generator | None) -> tuple[torch.Tensor, ...]:  # fmt: skip
    B, max_blocks = len(lengths), max(-(-n // BS) for n in lengths) + 1
    slots = (1 + B * max_blocks) * BS
    k = torch.randn(kv_heads, slots, D, generator=g, device=device).to(dtype)
    v = torch.randn(kv_heads, slots, D, generator=g, device=device).to(dtype)
    tables = (1 + torch.randperm(B * max_blocks, generator=g, device=device)).view(B, max_blocks)
    q_lens = torch.tensor([min(q, n) for n in lengths], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    queries = torch.randn(B * q, heads, D, generator=g, device=device).to(dtype)
    return queries, k, v, tables.to(torch.int32), seq_lens, q_lens


# -- step costs ------------------------------------------------------------------------------------


def step_costs(b: Any, engines: dict[str, TorchEngine], copy_gbs: float) -> dict[tuple, float]:
    """Graph (and eager) milliseconds per step over synthetic contexts (blocks taken, no prefill:
    the timing does not depend on the cached values); at the first context the other step (fused /
    unfused) beside. Fills ``b.graph_ms`` as it goes (a later failure keeps what was measured)."""
    for name, engine in engines.items():
        sets = {q: StepGraphs(engine, rows=q, logits=q, sizes=b.p.sizes, fused=b.fused) for q in (1, 5)}
        other = {q: StepGraphs(engine, rows=q, logits=q, sizes=b.p.sizes, fused=not b.fused) for q in (1, 5)}
        kv_token = 2 * engine.args.num_layers * engine.args.num_kv_heads * engine.args.head_dim * 2
        for ctx in b.p.contexts:
            for batch in b.p.batches:
                if not b.time_left(15 if name == "7b" else 6):
                    b.emit(section="step", model=name, ctx=ctx, batch=batch, skipped="time budget")
                    continue
                sids = synthetic(engine, batch, ctx)
                try:
                    for q, graphs in sets.items():
                        graph = _graph_step(b, engine, graphs, sids, ctx, q)
                        eager = _eager_step(b, engine, sids, ctx, q)
                        b.graph_ms[(name, ctx, batch, q)] = graph
                        weights = engine.model.streamed_bytes
                        gbs = (weights + batch * (ctx + q) * kv_token) / graph / 1e9
                        row: dict[str, Any] = {}
                        if ctx == b.p.contexts[0] and (batch == 1 or not b.tiny) and not b.fused_failed:
                            ms = _graph_step(b, engine, other[q], sids, ctx, q, once=True) * 1e3
                            row = {"unfused_ms" if b.fused else "fused_ms": round(ms, 3)}
                        b.emit(section="step", model=name, ctx=ctx, batch=batch, rows=q, fused=b.fused,
                               graph_ms=round(graph * 1e3, 3), eager_ms=round(eager * 1e3, 3),
                               weights_gb_s=round(weights / graph / 1e9, 1), total_gb_s=round(gbs, 1),
                               of_copy_ceiling=round(gbs / copy_gbs, 3), **row)  # fmt: skip
                finally:
                    for sid in sids:
                        engine.free(sid)
    return b.graph_ms


def synthetic(engine: TorchEngine, batch: int, ctx: int) -> list[int]:
    sids = list(range(900_000, 900_000 + batch))
    for sid in sids:
        engine.add_sequence(sid, engine.max_context)
        engine.blocks.append(sid, ctx)
    return sids


def _graph_step(
    b: Any, engine: TorchEngine, graphs: StepGraphs, sids: list[int], ctx: int, q: int, once: bool = False
) -> float:
    """Median seconds per replay; ``once``: on the tiny models one call and no warm-up (the
    interpreted fused step beside the unfused one only has to run)."""
    b_pad = len(sids)
    graphs.ensure_captured(b_pad)
    for sid in sids:
        engine.blocks.append(sid, q)
    graphs.stage([SeqRows([7] * q, ctx, engine.blocks.block_table(sid)) for sid in sids])
    graphs.upload()
    iters, warmup = (1, 0) if b.tiny and once else (5, 2) if b.tiny else (30, 10)
    seconds = b.timed(lambda: graphs.run(b_pad), iters=iters, warmup=warmup)
    for sid in sids:
        engine.truncate(sid, ctx)
    return seconds


def _eager_step(b: Any, engine: TorchEngine, sids: list[int], ctx: int, q: int) -> float:
    def step() -> None:
        engine.forward([ForwardInput(sid, [7] * q, q) for sid in sids])
        for sid in sids:
            engine.truncate(sid, ctx)

    return b.timed(step, iters=3 if b.tiny else 10, warmup=1 if b.tiny else 3)


def ratios(b: Any) -> None:
    ctx = b.p.contexts[0]
    for batch in b.p.batches:
        ms = {
            name: (b.graph_ms.get((name, ctx, batch, 1)), b.graph_ms.get((name, ctx, batch, 5)))
            for name in QWEN
        }
        row: dict[str, Any] = {"section": "ratios", "ctx": ctx, "batch": batch}
        for name, (decode, verify) in ms.items():
            if decode and verify:
                row[f"verify_over_decode_{name}"] = round(verify / decode, 3)
        for draft, target in (("0.5b", "7b"), ("1.5b", "7b"), ("0.5b", "1.5b")):
            if ms[draft][0] and ms[target][0]:
                row[f"c_{draft}_{target}"] = round(ms[draft][0] / ms[target][0], 3)  # type: ignore[operator]
        b.emit(**row)


def sampler_costs(b: Any, engine: TorchEngine) -> None:
    """The verify graph (5 rows a sequence) per sampler mode: greedy, temperature 0.7, 0.7 with top-p
    0.9 (the device kept set), and greedy with log-probs; milliseconds and the ratio to greedy."""
    from trispec.sampling.graph_sampler import SamplerMode

    modes = {
        "greedy": SamplerMode(),
        "t0.7": SamplerMode(noise=True),
        "t0.7_top_p": SamplerMode(noise=True, kept=True),
        "log_probs": SamplerMode(log_probs=True),
    }
    graphs = StepGraphs(engine, rows=5, logits=5, sizes=b.p.sizes, capture=b.cuda, fused=b.fused)
    ctx = b.p.contexts[0]
    for batch in b.p.batches:
        if not b.time_left(10):
            b.emit(section="sampler", batch=batch, skipped="time budget")
            continue
        sids = synthetic(engine, batch, ctx)
        try:
            for sid in sids:
                engine.blocks.append(sid, 5)
            ms = {}
            for name, mode in modes.items():
                graphs.ensure_captured(batch, mode)
                graphs.stage([SeqRows([7] * 5, ctx, engine.blocks.block_table(sid)) for sid in sids])
                top_p = 0.9 if mode.kept else 1.0
                sp = SamplingParams(temperature=0.7, top_p=top_p, seed=1, return_log_probs=True)
                graphs.stage_sampling([(sp, 100) if mode.noise else None for _ in sids])
                graphs.upload(sampling=True)
                ms[name] = b.timed(lambda m=mode, n=batch: graphs.run(n, m), iters=3 if b.tiny else 30,
                                   warmup=1 if b.tiny else 5) * 1e3  # fmt: skip
        finally:
            for sid in sids:
                engine.free(sid)
        ratio = {f"{n}_over_greedy": round(v / ms["greedy"], 3) for n, v in ms.items() if n != "greedy"}
        b.emit(section="sampler", batch=batch, **{f"{n}_ms": round(v, 3) for n, v in ms.items()}, **ratio)
