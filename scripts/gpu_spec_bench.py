"""Does speculation pay on a GPU, for all the traffic? One prepared run (<= 6 minutes on an H100,
``--budget-s 330``) of the CUDA-graph path on random weights of real Qwen2.5 shapes (bf16, drawn on
the GPU), printing JSON lines as it goes and a table at the end. Every section is guarded: an error
is an ``error`` row (the message and where), and the run goes on to the next section. Greedy first:

1. ``plan``: every point's KV and device memory, before anything is built (``gpu_bench_plan.py``);
   ``warm``: every Triton variant the run launches compiled into Triton's cache, in parallel
   (``trispec/runners/graph_aot.py``), so no timed section compiles (``triton_compiles`` in the
   summary counts compiles after it);
2. the copy-bandwidth ceiling; the Triton paged-attention kernel (bf16) against an fp32 reference and
   its time (``gpu_bench_steps.py``);
3. ``fused_check`` (``gpu_kernels.py``): the fused step against the unfused one on the device (largest
   logit difference, argmax agreement) for every model, before any section uses it: where it fails or
   raises, the run measures the unfused step (``fused_step_failed``); ``kernels``: per model, the
   kernels one step launches, unfused and fused, counted from the code and, on CUDA, by the profiler
   (a profiler error is a ``profiler_error``, not a step error);
4. step costs: eager against graph replay for 0.5B, 1.5B, 7B at batch 1, 8, 32, context 512, 2048,
   with GB/s, verify/decode and draft/target ratios; at context 512 the other step beside;
5. greedy generation (``gpu_bench_generation.py``): plain tok/s on graphs at batch 1, 8, 32, 256 and
   eager at batch 1; 0.5B draft -> 7B with an oracle of acceptance a (its drafts drawn before the
   timed loop); a suffix draft; the 7B as its own draft; the scheduler's greedy arms
   (``gpu_bench_scheduler.py``: plain, model, suffix);
6. sampled: the device sampler per mode; plain and speculative at temperature 0.7; the scheduler's
   sampled and mixed arms (every graph size and mode a mix can meet captured before its timing).

    python scripts/gpu_spec_bench.py                      # on the GPU machine (the fused step)
    python scripts/gpu_spec_bench.py --step unfused       # every section on the unfused step
    python scripts/gpu_spec_bench.py --device cpu --tiny  # CI: the same code on tiny models, seconds

Rows of a section that would run past the time budget are skipped and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
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
    parser.add_argument("--step", choices=["fused", "unfused"], default=None,
                        help="the static step of every section (the step section times both)")  # fmt: skip
    return parser.parse_args(argv)


if __name__ == "__main__":  # (imported by the tests, which set the interpreter themselves)
    ARGS = parse_args()
    if ARGS.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernel modules are imported
sys.path.insert(0, str(ROOT / "python_backend"))

import torch  # noqa: E402
from gpu_bench_plan import QWEN, Points, memory_plan, model_args  # noqa: E402
from trispec.engine.kv_cache import BlockManager  # noqa: E402
from trispec.engine.torch_engine import TorchEngine  # noqa: E402


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
        self.p = Points.of(args.tiny, args.tokens)
        self.fused = args.step == "fused" if args.step else self.cuda
        self.fused_failed = False  # the fused step failed on the device: nothing runs it again
        self.graph_ms: dict[tuple, float] = {}  # (model, ctx, batch, rows) -> seconds per replay
        self.compiles: int | None = None  # Triton compiles (cache misses) since the warm-up
        self.engines: list[TorchEngine] = []

    @property
    def tokens(self) -> int:
        return self.p.tokens

    def emit(self, **row: Any) -> None:
        row["t_s"] = round(time.perf_counter() - self.t0, 1)
        self.rows.append(row)
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if self.out:
            self.out.write(line + "\n")
            self.out.flush()

    def section(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)``; an exception is an ``error`` row for ``name`` and None, and the run goes on
        (after a CUDA error the context may be lost: later sections then say so in their own rows)."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            where = [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)][
                -4:
            ]
            self.emit(section=name, error=f"{type(e).__name__}: {e}"[:400], at=where)
            for engine in self.engines:  # what the failed section held is dropped: whole pools again
                engine.blocks = BlockManager(engine.blocks.num_blocks, engine.blocks.block_size)
            return None

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

    def engine(self, name: str, seed: int, kv_mb: float) -> TorchEngine:
        t = time.perf_counter()
        args = model_args(name, self.tiny, self.p.max_context)
        engine = TorchEngine.from_random(args, seed, dtype=self.dtype, device=self.device, kv_cache_mb=kv_mb,
                                         max_context=self.p.max_context)  # fmt: skip
        self.sync()
        self.engines.append(engine)
        self.emit(section="build", model=name, seconds=round(time.perf_counter() - t, 2),
                  weight_gb=round(engine.model.weight_bytes / 1e9, 3), kv_mb=kv_mb)  # fmt: skip
        return engine

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def plan(b: Bench) -> dict[str, Any]:
    """Every point's KV and the run's device memory, against what the device has free."""
    row = memory_plan(b.p, 2 if b.cuda else 4)
    if b.cuda:
        free, _ = torch.cuda.mem_get_info()
        row.update(free_gb=round(free / 1e9, 2), fits=row["total_gb"] * 1e9 <= free)
    b.emit(section="plan", **row)
    return row


def warm(b: Bench) -> None:
    """Compile every variant the run launches for this device, in worker processes (the JIT then
    finds each in its cache), and count later compiles (there should be none)."""
    from triton import knobs

    if not b.cuda:
        b.emit(
            section="warm",
            skipped="the CPU run interprets the kernels (tests/test_triton_aot.py compiles them)",
        )
        return
    from gpu_bench_plan import round_shapes
    from gpu_bench_steps import kernel_check_launches
    from trispec.runners.graph_aot import compile_rounds

    major, minor = torch.cuda.get_device_capability()
    t = time.perf_counter()
    results = compile_rounds(round_shapes(b.tiny), [10 * major + minor], os.cpu_count() or 1,
                             extra=lambda: kernel_check_launches(b.tiny))  # fmt: skip
    failed = [f"{r.variant.describe()}: {r.error}"[:300] for r in results if r.error]
    b.emit(
        section="warm", variants=len(results), seconds=round(time.perf_counter() - t, 1), failed=failed[:5]
    )

    def listener(*, cache_hit: bool, **_: Any) -> None:
        b.compiles = (b.compiles or 0) + (not cache_hit)

    b.compiles = 0
    knobs.compilation.listener = listener


def table(b: Bench) -> None:
    print("\n== summary ==")
    shown = ("plan", "warm", "copy", "kernels", "fused_check", "fused_step_failed", "ratios", "sampler",
             "plain", "spec", "divergence", "scheduler")  # fmt: skip
    for row in b.rows:
        if row["section"] in shown or "error" in row or (row["section"] == "step" and "graph_ms" in row):
            print("  ".join(f"{k}={v}" for k, v in row.items() if k not in ("t_s", "profiled_layer_kernels")))
    errors = [r["section"] for r in b.rows if "error" in r]
    compiles = "no warm-up" if b.compiles is None else b.compiles
    print(f"errors in: {errors or 'none'}; Triton compiles after the warm-up: {compiles}")
    print(f"total {time.perf_counter() - b.t0:.1f} s")


def main(args: argparse.Namespace) -> None:
    import gpu_bench_generation as gen
    import gpu_bench_steps as steps
    from gpu_bench_scheduler import GREEDY_ARMS, SAMPLED_ARMS, scheduler_section
    from gpu_kernels import fused_check, kernels_section
    from trispec.drafters.model_drafter import ModelDrafter

    b = Bench(args)
    name = torch.cuda.get_device_name(0) if b.cuda else "cpu"
    import triton

    b.emit(section="env", device=name, torch=torch.__version__, triton=triton.__version__, tiny=b.tiny,
           python=sys.version.split()[0])  # fmt: skip
    kv_mb = plan(b)["kv_mb"]
    b.section("warm", warm, b)
    copy_gbs = b.section("copy", steps.copy_ceiling, b) or float("nan")
    b.section("kernel_check", steps.kernel_check, b)
    engines = {}
    for i, model in enumerate(QWEN):
        engine = b.section("build", b.engine, model, i, kv_mb[model])
        if engine is not None:
            engines[model] = engine
    b.section("fused_check", fused_check, b, engines)  # before anything runs the fused step
    b.section("kernels", kernels_section, b, engines)
    b.section("step", steps.step_costs, b, engines, copy_gbs)
    b.section("ratios", steps.ratios, b)
    target, draft = engines.get("7b"), engines.get("0.5b")
    if target is None or draft is None:
        b.emit(section="generation", error="the 7B or the 0.5B was not built: no generation sections")
        table(b)
        return
    drafter = ModelDrafter(draft)
    plain_runs = b.section("plain", gen.plain_greedy, b, target) or {}
    b.section("plain", gen.plain_eager, b, target)
    b.section("spec", gen.spec_greedy, b, target, drafter, plain_runs)
    b.section("spec", gen.suffix_greedy, b, target, plain_runs)
    b.section("spec", gen.self_draft, b, target, plain_runs)
    b.section("scheduler", scheduler_section, b, target, draft, GREEDY_ARMS)
    # sampled traffic
    b.section("sampler", steps.sampler_costs, b, target)
    b.section("spec", gen.spec_sampled, b, target, drafter)
    b.section("scheduler", scheduler_section, b, target, draft, SAMPLED_ARMS)
    table(b)


if __name__ == "__main__":
    main(ARGS)
