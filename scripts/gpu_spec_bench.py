"""Does speculation pay on a GPU, for all the traffic? One prepared run (<= 6 minutes on an H100,
``--budget-s 330``) of the CUDA-graph path on random weights of real Qwen2.5 shapes (bf16, drawn on
the GPU), printing JSON lines as it goes and a table at the end:

1. the copy-bandwidth ceiling (device-to-device copy);
2. the Triton paged-attention kernel (bf16) against an fp32 reference: max relative error, and its
   time at batch 1 and 32, context 512 and 2048;
3. ``kernels`` (scripts/gpu_kernels.py): per model, the kernels one static step launches, unfused
   and fused, in all and per layer: counted from the code (any device) and, on CUDA, by the profiler;
   step costs, eager ``TorchEngine.forward`` against the graph replay, for 0.5B, 1.5B and 7B at
   batch 1, 8, 32 and context 512, 2048: milliseconds and achieved GB/s (weights, and weights + KV
   read), verify (k + 1 = 5 rows) / decode and draft / target ratios; every model with the KV its
   largest point needs; at context 512 the other static step too (``unfused_ms`` / ``fused_ms``);
4. the device sampler: the 7B verify graph per sampler mode (greedy, T 0.7, T 0.7 + top-p, log-probs);
5. plain tok/s on graphs at batch 1, 8, 32, 256, eager at batch 1;
6. speculative tok/s (scripts/gpu_bench_generation.py): 0.5B draft -> 7B target with an oracle of
   per-position acceptance a, re-derived from the run's own verified output, at batch 1, 8, 32,
   greedy and sampled, a ``divergence`` row per greedy cell; a suffix draft; the 7B as its own draft;
7. the ``scheduler`` section (scripts/gpu_bench_scheduler.py): Scheduler + TorchSpecRunner as served,
   arms plain, model, sampled, suffix and mix, with ms_per_step, graph_rounds and eager_rounds.

    python scripts/gpu_spec_bench.py                      # on the GPU machine (the fused step)
    python scripts/gpu_spec_bench.py --step unfused       # every section on the unfused step
    python scripts/gpu_spec_bench.py --device cpu --tiny  # CI: the same code on tiny models, seconds

Sections 5 and 6 drive ``GraphRound`` directly (no scheduler); section 7 is the served path. Rows of a
section that would run past the time budget are skipped and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="tiny models and sizes (CI on CPU)")
    parser.add_argument("--budget-s", type=float, default=330.0, help="skip what would run past this")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per generation")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON lines here")
    # default: fused on CUDA; unfused on the CPU, where the fused kernels run interpreted
    parser.add_argument(
        "--step",
        choices=["fused", "unfused"],
        default=None,
        help="the static step every section runs; the step section times the other too",
    )
    return parser.parse_args(argv)


ARGS = parse_args()
if ARGS.device == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel module is imported
sys.path.insert(0, str(ROOT / "python_backend"))

import torch  # noqa: E402
from trispec.drafters.model_drafter import ModelDrafter  # noqa: E402
from trispec.engine.args import ModelArgs  # noqa: E402
from trispec.engine.base import ForwardInput  # noqa: E402
from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs  # noqa: E402
from trispec.engine.gpu.static_attention import reference_paged_attention  # noqa: E402
from trispec.engine.torch_engine import TorchEngine  # noqa: E402
from trispec.sampling_params import SamplingParams  # noqa: E402

# Qwen2.5 shapes (scripts/cuda_step_costs.py); one vocabulary for all three (the 0.5B and 1.5B
# files say 151936, the 7B 152064: a random target could emit an id its draft cannot embed)
QWEN = {
    "0.5b": dict(vocab_size=152064, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, head_dim=64, tie_embeddings=True),
    "1.5b": dict(vocab_size=152064, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                 num_kv_heads=2, head_dim=128, tie_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
               num_kv_heads=4, head_dim=128, tie_embeddings=False),
}  # fmt: skip
TINY = {  # the same GQA ratios (7, 6, 7), two layers
    "0.5b": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=14,
                 num_kv_heads=2, head_dim=16, tie_embeddings=True),
    "1.5b": dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=12,
                 num_kv_heads=2, head_dim=16, tie_embeddings=True),
    "7b": dict(vocab_size=320, hidden_size=96, intermediate_size=192, num_layers=2, num_heads=28,
               num_kv_heads=4, head_dim=16, tie_embeddings=False),
}  # fmt: skip


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        if args.tiny:
            torch.set_num_threads(1)  # models this small gain nothing from threads, and CI shares cores
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.tiny = args.tiny
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.t0 = time.perf_counter()
        self.budget_s = args.budget_s
        self.out = args.out.open("w") if args.out else None
        self.rows: list[dict[str, Any]] = []
        self.batches = (1, 2) if self.tiny else (1, 8, 32)
        self.contexts = (40,) if self.tiny else (512, 2048)
        self.tokens = 24 if self.tiny else args.tokens
        # graph sizes; plain decoding also runs past the largest (in parts) on the tiny models
        self.sizes = (1, 2, 4) if self.tiny else (1, 8, 32, 256)
        self.plain_batches = (1, 2, 8) if self.tiny else (1, 8, 32, 256)
        # the tiny run only has to pass through every code path once
        # k = 5 at batch 1 only (issue 33's target: a = 0.8, k = 5)
        self.ks, self.accepts = ((3,), (0.7,)) if self.tiny else ((3, 4, 5), (0.6, 0.7, 0.8, 0.9))
        self.fused = args.step == "fused" if args.step else self.cuda
        self.fused_failed = False  # the fused step failed on the device: nothing runs it again

    def emit(self, **row: Any) -> None:
        row["t_s"] = round(time.perf_counter() - self.t0, 1)
        self.rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if self.out:
            self.out.write(line + "\n")

    def time_left(self, need_s: float) -> bool:
        return time.perf_counter() - self.t0 + need_s <= self.budget_s

    def timed(self, fn: Callable[[], object], iters: int, warmup: int) -> float:
        """Median seconds per call (CUDA events around each call on a GPU)."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times)

    def engine(self, name: str, seed: int, max_context: int, kv_mb: float) -> TorchEngine:
        shapes = (TINY if self.tiny else QWEN)[name]
        args = ModelArgs(arch="qwen2", rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True,
                         max_position_embeddings=max(4096, max_context), **shapes)  # fmt: skip
        t = time.perf_counter()
        engine = TorchEngine.from_random(
            args, seed, dtype=self.dtype, device=self.device, kv_cache_mb=kv_mb, max_context=max_context
        )
        self.sync()
        self.emit(section="build", model=name, seconds=round(time.perf_counter() - t, 2),
                  weight_gb=round(engine.model.weight_bytes / 1e9, 3))  # fmt: skip
        return engine

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


# -- 1, 2: bandwidth and the kernel ---------------------------------------------------------------


def copy_ceiling(b: Bench) -> float:
    n = (1 << 20) if b.tiny else (1 << 29)  # bf16 elements: 1 GiB on the GPU
    src = torch.empty(n, dtype=torch.bfloat16, device=b.device)
    dst = torch.empty_like(src)
    seconds = b.timed(lambda: dst.copy_(src), iters=5 if b.tiny else 20, warmup=2)
    gbs = 2 * src.nbytes / seconds / 1e9  # read + write
    b.emit(section="copy", gb_per_s=round(gbs, 1))
    return gbs


def kernel_check(b: Bench) -> None:
    from trispec.engine.gpu.triton_attention import paged_attention, splits_for

    BS, D = 16, (16 if b.tiny else 128)
    g = torch.Generator(device=b.device).manual_seed(0)
    lengths = [0, 1, 16, 17, 40 if b.tiny else 500]
    # tiny (interpreted): each code path once; tests/test_triton_attention.py checks the kernel
    for heads, kv_heads, q in ((14, 2, 1), (14, 2, 5), (12, 2, 5)):
        case = _kernel_case(b, g, heads, kv_heads, lengths, q, BS, D)
        for splits in (1,) if b.tiny and q > 1 else (1, 4):
            out = paged_attention(*case, block_size=BS, scale=D**-0.5, splits=splits)
            ref = reference_paged_attention(
                case[0].float(), case[1].float(), case[2].float(), *case[3:], block_size=BS, scale=D**-0.5
            )
            err = ((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
            b.emit(section="kernel_error", gqa=heads // kv_heads, q=q, splits=splits, max_rel_err=err)
    for batch in b.batches[:1] if b.tiny else b.batches:
        for ctx in b.contexts:
            case = _kernel_case(b, g, 28, 4, [ctx] * batch, 1, BS, D)
            splits = splits_for(batch, 4)
            ms = b.timed(lambda c=case, s=splits: paged_attention(*c, block_size=BS, scale=D**-0.5, splits=s),
                         iters=1 if b.tiny else 50, warmup=0 if b.tiny else 2) * 1e3  # fmt: skip
            b.emit(section="kernel_time", batch=batch, ctx=ctx, splits=splits, ms=round(ms, 4))


def _kernel_case(b: Bench, g: torch.Generator, heads: int, kv_heads: int, lengths: list[int], q: int,
                 BS: int, D: int) -> tuple[torch.Tensor, ...]:  # fmt: skip
    B, max_blocks = len(lengths), max(-(-n // BS) for n in lengths) + 1
    slots = (1 + B * max_blocks) * BS
    k = torch.randn(kv_heads, slots, D, generator=g, device=b.device).to(b.dtype)
    v = torch.randn(kv_heads, slots, D, generator=g, device=b.device).to(b.dtype)
    tables = (1 + torch.randperm(B * max_blocks, generator=g, device=b.device)).view(B, max_blocks)
    q_lens = torch.tensor([min(q, n) for n in lengths], dtype=torch.int32, device=b.device)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=b.device)
    queries = torch.randn(B * q, heads, D, generator=g, device=b.device).to(b.dtype)
    return queries, k, v, tables.to(torch.int32), seq_lens, q_lens


# -- 3: step costs --------------------------------------------------------------------------------


def step_costs(b: Bench, engines: dict[str, TorchEngine], copy_gbs: float) -> dict[tuple, float]:
    """Graph (and eager) milliseconds per step over synthetic contexts (blocks taken, no prefill:
    the timing does not depend on the cached values)."""
    graph_ms: dict[tuple, float] = {}
    for name, engine in engines.items():
        sets = {q: StepGraphs(engine, rows=q, logits=q, sizes=b.sizes, fused=b.fused) for q in (1, 5)}
        # the other step (fused / unfused) at the first context: before and after in one run
        other = {q: StepGraphs(engine, rows=q, logits=q, sizes=b.sizes, fused=not b.fused) for q in (1, 5)}
        kv_token = 2 * engine.args.num_layers * engine.args.num_kv_heads * engine.args.head_dim * 2
        for ctx in b.contexts:
            for batch in b.batches:
                if not b.time_left(15 if name == "7b" else 6):
                    b.emit(section="step", model=name, ctx=ctx, batch=batch, skipped="time budget")
                    continue
                sids = _synthetic(engine, batch, ctx)
                for q, graphs in sets.items():
                    graph = _graph_step(b, engine, graphs, sids, ctx, q)
                    eager = _eager_step(b, engine, sids, ctx, q)
                    graph_ms[(name, ctx, batch, q)] = graph
                    weights = engine.model.streamed_bytes
                    kv = batch * (ctx + q) * kv_token
                    gbs = (weights + kv) / graph / 1e9
                    row: dict[str, Any] = {}
                    if ctx == b.contexts[0] and (batch == 1 or not b.tiny) and not b.fused_failed:
                        ms = _graph_step(b, engine, other[q], sids, ctx, q, once=True) * 1e3
                        row = {"unfused_ms" if b.fused else "fused_ms": round(ms, 3)}
                    b.emit(section="step", model=name, ctx=ctx, batch=batch, rows=q, fused=b.fused,
                           graph_ms=round(graph * 1e3, 3), eager_ms=round(eager * 1e3, 3),
                           weights_gb_s=round(weights / graph / 1e9, 1), total_gb_s=round(gbs, 1),
                           of_copy_ceiling=round(gbs / copy_gbs, 3), **row)  # fmt: skip
                for sid in sids:
                    engine.free(sid)
    return graph_ms


def _synthetic(engine: TorchEngine, batch: int, ctx: int) -> list[int]:
    sids = list(range(900_000, 900_000 + batch))
    for sid in sids:
        engine.add_sequence(sid, engine.max_context)
        engine.blocks.append(sid, ctx)
    return sids


def _graph_step(
    b: Bench, engine: TorchEngine, graphs: StepGraphs, sids: list[int], ctx: int, q: int, once: bool = False
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


def _eager_step(b: Bench, engine: TorchEngine, sids: list[int], ctx: int, q: int) -> float:
    def step() -> None:
        engine.forward([ForwardInput(sid, [7] * q, q) for sid in sids])
        for sid in sids:
            engine.truncate(sid, ctx)

    return b.timed(step, iters=3 if b.tiny else 10, warmup=1 if b.tiny else 3)


def ratios(b: Bench, graph_ms: dict[tuple, float]) -> None:
    ctx = b.contexts[0]
    for batch in b.batches:
        ms = {
            name: (graph_ms.get((name, ctx, batch, 1)), graph_ms.get((name, ctx, batch, 5))) for name in QWEN
        }
        row: dict[str, Any] = {"section": "ratios", "ctx": ctx, "batch": batch}
        for name, (decode, verify) in ms.items():
            if decode and verify:
                row[f"verify_over_decode_{name}"] = round(verify / decode, 3)
        for draft, target in (("0.5b", "7b"), ("1.5b", "7b"), ("0.5b", "1.5b")):
            if ms[draft][0] and ms[target][0]:
                row[f"c_{draft}_{target}"] = round(ms[draft][0] / ms[target][0], 3)  # type: ignore[operator]
        b.emit(**row)


# -- 3b: the device sampler's cost ---------------------------------------------------------------


def sampler_costs(b: Bench, engine: TorchEngine) -> None:
    """The verify graph (5 rows a sequence) per sampler mode: greedy, temperature 0.7, 0.7 with top-p
    0.9 (the device kept set), and greedy with log-probs; milliseconds and the ratio to greedy."""
    from trispec.sampling.graph_sampler import SamplerMode

    modes = {
        "greedy": SamplerMode(),
        "t0.7": SamplerMode(noise=True),
        "t0.7_top_p": SamplerMode(noise=True, kept=True),
        "log_probs": SamplerMode(log_probs=True),
    }
    graphs = StepGraphs(engine, rows=5, logits=5, sizes=b.sizes, capture=b.cuda, fused=b.fused)
    for batch in b.batches:
        if not b.time_left(10):
            b.emit(section="sampler", batch=batch, skipped="time budget")
            continue
        sids = _synthetic(engine, batch, b.contexts[0])
        for sid in sids:
            engine.blocks.append(sid, 5)
        ms = {}
        for name, mode in modes.items():
            graphs.ensure_captured(batch, mode)
            graphs.stage([SeqRows([7] * 5, b.contexts[0], engine.blocks.block_table(sid)) for sid in sids])
            top_p = 0.9 if mode.kept else 1.0
            sp = SamplingParams(temperature=0.7, top_p=top_p, seed=1, return_log_probs=True)
            graphs.stage_sampling([(sp, 100) if mode.noise else None for _ in sids])
            graphs.upload(sampling=True)
            ms[name] = b.timed(lambda m=mode, n=batch: graphs.run(n, m), iters=3 if b.tiny else 30,
                               warmup=1 if b.tiny else 5) * 1e3  # fmt: skip
        for sid in sids:
            engine.free(sid)
        ratio = {f"{n}_over_greedy": round(v / ms["greedy"], 3) for n, v in ms.items() if n != "greedy"}
        b.emit(section="sampler", batch=batch, **{f"{n}_ms": round(v, 3) for n, v in ms.items()}, **ratio)


SUMMARY = (
    "copy",
    "kernels",
    "fused_step_failed",
    "ratios",
    "sampler",
    "plain",
    "spec",
    "divergence",
    "scheduler",
)


def table(b: Bench) -> None:
    print("\n== summary ==")
    for row in b.rows:
        if row["section"] in SUMMARY or (row["section"] == "step" and "graph_ms" in row):
            print("  ".join(f"{k}={v}" for k, v in row.items() if k not in ("t_s", "profiled_layer_kernels")))
    print(f"total {time.perf_counter() - b.t0:.1f} s")


def kv_mb_for(b: Bench, name: str, tokens: int) -> float:
    """MiB of KV for ``tokens`` tokens of model ``name`` (plus 10% and a block per sequence's slack):
    every model gets what its largest point needs (the first H100 run gave the small ones a quarter
    of it and crashed at batch 32, context 2048)."""
    a = (TINY if b.tiny else QWEN)[name]
    per_token = 2 * a["num_layers"] * a["num_kv_heads"] * a["head_dim"] * (2 if b.cuda else 4)
    return 1.1 * tokens * per_token / 2**20 + 16


def main() -> None:
    from gpu_bench_generation import GREEDY, SAMPLED, plain, plain_eager, speculative, suffix_spec
    from gpu_bench_scheduler import scheduler_section
    from gpu_kernels import kernels_section

    b = Bench(ARGS)
    name = torch.cuda.get_device_name(0) if b.cuda else "cpu"
    import triton

    b.emit(section="env", device=name, torch=torch.__version__, triton=triton.__version__, tiny=b.tiny)
    copy_gbs = copy_ceiling(b)
    kernel_check(b)
    max_ctx = max(b.contexts) + 2 * b.tokens + 128
    # the largest points: step costs (max batch x max context) and plain decoding at the largest batch
    need = max(max(b.batches) * (max(b.contexts) + 8), b.plain_batches[-1] * (64 + b.tokens + 16))
    engines = {n: b.engine(n, i, max_ctx, kv_mb_for(b, n, need)) for i, n in enumerate(QWEN)}
    kernels_section(b, engines)
    failed = [r["error"] for r in b.rows if r["section"] == "kernels" and r.get("fused") and "error" in r]
    if b.fused and failed:  # the rest of the one GPU run still measures something
        b.fused, b.fused_failed = False, True
        b.emit(section="fused_step_failed", error=failed[0], step="unfused from here on")
    graph_ms = step_costs(b, engines, copy_gbs)
    ratios(b, graph_ms)
    target, draft = engines["7b"], engines["0.5b"]
    sampler_costs(b, target)
    plain_runs = {}
    for batch in b.plain_batches:
        if batch == 1 or b.time_left(30):
            plain_runs[batch] = plain(b, target, batch)
    plain_eager(b, target)
    drafter = ModelDrafter(draft)
    for batch in b.batches:
        if batch not in plain_runs:
            continue
        tok_s, outputs = plain_runs[batch]
        for k in b.ks if batch == 1 else b.ks[:2]:
            for a in b.accepts if batch == 1 else (0.7,):
                if b.time_left(15):
                    speculative(b, target, drafter, k, a, outputs, tok_s, "0.5b")
                else:
                    b.emit(section="spec", draft="0.5b", batch=batch, k=k, a=a, skipped="time budget")
    for batch in b.batches:
        if not b.time_left(20):
            b.emit(section="spec", draft="0.5b", batch=batch, temperature=0.7, skipped="time budget")
            continue
        tok_s, outputs = plain(b, target, batch, SAMPLED)
        speculative(b, target, drafter, b.ks[0], 0.7, outputs, tok_s, "0.5b", SAMPLED)
        if batch in plain_runs:
            suffix_spec(b, target, batch, b.ks[0], *plain_runs[batch])
    if b.time_left(20):
        # the same weights with a KV pool of their own
        self_draft = TorchEngine(target.model, num_blocks=target.blocks.num_blocks,
                                 block_size=target.block_size, max_context=target.max_context)  # fmt: skip
        speculative(b, target, ModelDrafter(self_draft), 4, None, plain_runs[1][1][:1], plain_runs[1][0],
                    "7b-self", GREEDY)  # fmt: skip
    scheduler_section(b, target, draft, graph_ms)
    table(b)


if __name__ == "__main__":
    main()
