"""Compile every Triton kernel of the project ahead of time for GPU targets, on any machine (no GPU):
each launch the GPU path can make (``trispec.runners.graph_aot``) for the engines of the shipped
configs and of the GPU benchmark (scripts/gpu_bench_plan.py: real and tiny shapes, the latter also
what the tests run on a device build), specialised as Triton's JIT would, compiled to a cubin per target.

    python scripts/triton_aot.py                       # sm_80, sm_90, sm_100, every shape (CI)
    python scripts/triton_aot.py --arch 90 --bench     # the GPU bench's shapes only
    python scripts/triton_aot.py --list                # the variants, not compiled

Prints one line per variant that failed and a JSON summary last; exits 1 if any failed. Run it with
``TRITON_INTERPRET`` unset (it removes it from its own environment before importing the kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels: read when the kernel modules are imported
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402
from trispec.runners.graph_aot import EngineShape, RoundShape, compile_rounds, kernels  # noqa: E402

CONFIGS = ROOT / "python_backend" / "trispec" / "configs"
# shipped configs whose weights `make test` does not install: the bench's shapes of the same models
NOT_INSTALLED = {"qwen-coder-pair.yaml": ("1.5b", "0.5b", 151936)}


def args_of(checkpoint: Any, field: str) -> Any:
    from trispec.checkpoints import resolve_checkpoint
    from trispec.engine.weights import load_checkpoint

    return load_checkpoint(resolve_checkpoint(checkpoint, field))[0]


def config_shapes(notes: list[str]) -> list[RoundShape]:
    """Each shipped config as served on CUDA: its target and drafter, dtypes, ``max_k``, block size
    and context (a self-draft runs in bf16; weights kept as GGUF blocks are CPU-only: not here)."""
    import dataclasses

    from gpu_bench_plan import model_args
    from trispec.config import load_config
    from trispec.errors import ConfigError

    shapes = []
    for path in sorted(CONFIGS.glob("*.yaml")):
        config = load_config(path)
        if config.engine.kind != "torch" or config.target.weights == "gguf":
            notes.append(f"{path.name}: not a CUDA config (engine {config.engine.kind}, weights gguf)")
            continue
        s, d = config.scheduler, config.drafter
        try:
            target_args = args_of(config.target.checkpoint, "target.checkpoint")
            draft_args = None
            if d.kind == "model":
                assert d.model is not None
                draft_args = args_of(d.model.checkpoint, "drafter.model.checkpoint")
        except ConfigError:
            target_name, draft_name, vocab = NOT_INSTALLED[path.name]
            notes.append(f"{path.name}: weights not installed, the bench's {target_name}/{draft_name} shapes")
            target_args = dataclasses.replace(model_args(target_name, False, s.max_context), vocab_size=vocab)
            draft_args = dataclasses.replace(model_args(draft_name, False, s.max_context), vocab_size=vocab)
        dtype = getattr(torch, config.target.dtype)
        target = EngineShape(target_args, dtype, s.block_size, s.max_context)
        draft = None
        if d.kind == "self":
            draft = EngineShape(target_args, torch.bfloat16, s.block_size, s.max_context)
        elif d.kind == "model" and draft_args is not None:
            assert d.model is not None
            draft_dtype = (
                torch.bfloat16 if d.precision in ("bfloat16", "int8") else getattr(torch, d.model.dtype)
            )
            draft = EngineShape(draft_args, draft_dtype, s.block_size, s.max_context)
        shapes.append(RoundShape(f"config {path.name}", target, draft, (s.max_num_draft_tokens,)))
    return shapes


def bench_launches() -> list[Any]:
    """The bench's own direct kernel launches (its kernel check), real and tiny shapes."""
    from gpu_bench_steps import kernel_check_launches

    return kernel_check_launches(False) + kernel_check_launches(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch", type=int, action="append", help="compute capability x10 (default 80, 90, 100)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--bench", action="store_true", help="only the GPU bench's shapes")
    parser.add_argument("--tiny", action="store_true", help="with --bench: its tiny shapes")
    parser.add_argument("--list", action="store_true", help="enumerate and print, compile nothing")
    parser.add_argument("--json", type=Path, help="write every variant's result here")
    args = parser.parse_args()
    from gpu_bench_plan import round_shapes

    archs = args.arch or [80, 90, 100]
    notes: list[str] = []
    if args.bench:
        shapes = round_shapes(args.tiny)
    else:
        shapes = [*round_shapes(False), *round_shapes(True), *config_shapes(notes)]
    t0 = time.perf_counter()

    def progress(name: str, launches: int, new: int) -> None:
        print(
            f"{time.perf_counter() - t0:6.1f} s  {name}: {launches} launches, {new} new variants", flush=True
        )

    results = compile_rounds(shapes, archs, args.jobs, extra=bench_launches, on_shape=progress,
                             compile=not args.list)  # fmt: skip
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"FAILED {r.variant.describe()} ({', '.join(r.sources)}):\n  {r.error}", flush=True)
    if args.list:
        for r in results:
            print(r.variant.describe(), flush=True)
    if args.json:
        args.json.write_text(json.dumps([_row(r) for r in results], indent=1))
    summary = {
        "archs": archs,
        "variants": len(results),
        "failed": len(failed),
        "per_kernel": dict(Counter(r.variant.kernel.split(":")[1] for r in results)),
        "kernels": sorted(kernels()),
        "compile_s": round(sum(r.seconds for r in results), 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "max_shared": max((r.shared for r in results), default=0),
        "notes": notes,
    }
    print(json.dumps(summary))
    sys.exit(1 if failed else 0)


def _row(r: Any) -> dict[str, Any]:
    return {"variant": r.variant.describe(), "kernel": r.variant.kernel, "arch": r.variant.arch,
            "constexprs": [[list(p), v] for p, v in r.variant.constexprs], "sources": r.sources,
            "seconds": round(r.seconds, 3), "shared": r.shared, "ptx_instructions": r.instructions,
            "barriers": r.barriers, "error": r.error}  # fmt: skip


if __name__ == "__main__":
    main()
