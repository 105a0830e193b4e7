"""Every Triton kernel of the project compiles for the GPU, at every launch the engine can make.

The interpreter (every other Triton test here) never checks what a GPU compile does: loop-carried
types, layouts, the shared memory of a block. ``scripts/triton_aot.py`` runs the GPU path's own code
on the meta device for the engines of the shipped configs and of the GPU benchmark, records each
kernel launch, specialises it as Triton's JIT would on a device, and compiles it to a cubin for
sm_90 (H100/H200), on this CPU (``trispec/runners/graph_aot.py``). ``TRISPEC_AOT_ARCHS`` (e.g.
``80,90,100``) compiles for other targets too: every one of them passes, not run by default (the
whole matrix takes minutes on two cores). The compile (about three CPU-minutes for sm_90) starts in
the background when the suite is collected (``aot_compile.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import aot_compile
from required_builds import triton

ROOT = Path(__file__).resolve().parents[1]
triton()  # a failure where the test extra installs it, else a skip (required_builds.py)


def test_every_kernel_compiles_for_the_gpu_at_every_launch() -> None:
    # started when the suite collected this test, niced, beside the other tests (aot_compile.py)
    compile = aot_compile.start()
    rc, out, err = compile.wait(timeout=1800)
    assert rc == 0, out[-6000:] + err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    rows = json.loads(compile.variants.read_text())
    archs = compile.archs
    # every kernel the project defines is launched somewhere, for every target
    launched = {(r["kernel"], r["arch"]) for r in rows}
    assert launched == {(k, int(a)) for k in summary["kernels"] for a in archs}
    assert len(summary["kernels"]) == 6 and not [r for r in rows if r["error"]]
    constexprs: dict[str, set] = {r["kernel"].split(":")[1]: set() for r in rows}
    for r in rows:
        constexprs[r["kernel"].split(":")[1]].add(tuple(v for _, v in r["constexprs"]))
    # what the launch sites compute, not a list: GQA 7/6/3, head dims 64/128/16, split-KV 1..16,
    # the verify's k + 1 rows of the bench (4, 5, 6) and the configs (9), the draft's 1 and 2
    attend = constexprs["_attend"]
    assert {c[0] for c in attend} == {3, 6, 7} and {c[2] for c in attend} == {16, 64, 128}
    assert {c[6] for c in attend} == {1, 2, 4, 8, 16} and {c[1] for c in attend} == {1, 2, 4, 5, 6, 9}
    assert {c[7] for c in attend} == {False, True}  # bf16 tiles, and float32 ones (a float32 engine)
    assert summary["max_shared"] < 232_448
    # the in-place rotary store waits for every load of its row
    assert all(r["barriers"] >= 1 for r in rows if r["kernel"].endswith(":_bias_rope_write"))


def test_the_enumeration_misses_nothing_the_whole_product_finds() -> None:
    """``round_launches`` skips loops the step's code does not depend on (padded sizes of one split
    count, sampler modes on the fused layers and at other sizes, draft steps per ``max_k``, layers past
    the second); the whole product, on a tiny round of three layers, finds the same variants."""
    code = """
import dataclasses, json, sys
sys.path.insert(0, "scripts")
from gpu_bench_plan import round_shapes
from trispec.runners import graph_aot as A
found = A.kernels()
def deeper(engine):
    return dataclasses.replace(engine, args=dataclasses.replace(engine.args, num_layers=3))
# the tiny 7B (4 KV heads) with the tiny 0.5B draft (2): at sizes 1, 2, 24 the draft's split counts
# are 16, 16, 2, so the short enumeration skips its size 2
shape = round_shapes(True)[0]
shape = dataclasses.replace(shape, target=deeper(shape.target), draft=deeper(shape.draft), max_ks=(0, 3),
                            sizes=(1, 2, 24))
def variants(**kw):
    return {A.specialise(launch, 90, found) for launch in A.round_launches(shape, **kw)}
short, full = variants(), variants(exhaustive=True)
print(json.dumps([len(short), len(full), sorted(v.describe() for v in full ^ short)]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    short, full, differ = json.loads(run.stdout.strip().splitlines()[-1])
    assert short > 10 and full == short and not differ


def test_every_module_with_a_kernel_is_compiled() -> None:
    """``graph_aot.KERNEL_MODULES`` names every module of the package that defines a Triton kernel."""
    package = ROOT / "python_backend"
    defining = {
        ".".join(p.relative_to(package).with_suffix("").parts)
        for p in (package / "trispec").rglob("*.py")
        if re.search(r"^\s*@triton\.jit", p.read_text(), re.MULTILINE)
    }
    from trispec.runners.graph_aot import KERNEL_MODULES

    assert defining == set(KERNEL_MODULES)
