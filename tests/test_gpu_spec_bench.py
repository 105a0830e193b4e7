"""scripts/gpu_spec_bench.py in its CPU mode (tiny models, the torch reference attention, graphs run
eagerly, the Triton kernel interpreted): every section runs and reports, so that the GPU run it was
written for never spends device minutes on a Python error; the scheduler section's counts are real
(``capture=False``): every arm, the mix of arrivals included, on the graph path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_runs_every_section_on_tiny_models(tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_spec_bench.py"),
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by = {}
    for row in rows:
        by.setdefault(row["section"], []).append(row)
    assert not [r for r in rows if "skipped" in r]
    sections = {"env", "copy", "kernel_error", "kernel_time", "build", "step", "ratios", "sampler", "plain"}
    assert sections | {"spec", "divergence", "scheduler"} <= set(by)
    assert len(by["kernel_error"]) == 4 and all(r["max_rel_err"] < 1e-4 for r in by["kernel_error"])
    assert len(by["step"]) == 3 * 2 * 2  # models x batches x (decode, verify) at the one tiny context
    assert all(r["graph_ms"] > 0 and r["eager_ms"] > 0 for r in by["step"])
    assert {"c_0.5b_7b", "verify_over_decode_7b"} <= set(by["ratios"][0])
    # the kernels a step issues per layer, counted from the code: fused 9 + the split-KV merge; unfused
    # 16 + the merge + 8 (float32 on the CPU: its two norms spelled out in 5 ops each; bf16: 1 each)
    kernels = {(r["model"], r["rows"], r["fused"]): r for r in by["kernels"]}
    assert len(kernels) == 3 * 2 and not [r for r in kernels.values() if "error" in r]
    assert all(r["counted_per_layer"] == (10.0 if fused else 25.0) for (_, _, fused), r in kernels.items())
    assert all("fused_ms" in r for r in by["step"] if r["batch"] == 1)  # the other step, timed beside
    assert all(r["t0.7_ms"] > 0 and r["t0.7_top_p_ms"] > 0 for r in by["sampler"])
    # batch 8 runs as two parts of the largest tiny graph (4)
    assert [(r["path"], r["batch"]) for r in by["plain"]][:4] == [
        ("graph", 1),
        ("graph", 2),
        ("graph", 8),
        ("eager", 1),
    ]
    spec = {(r["draft"], r["batch"], r["temperature"]): r for r in by["spec"]}
    for batch in (1, 2):
        for temperature in (0.0, 0.7):
            controlled = spec[("0.5b", batch, temperature)]  # the oracle, re-derived from the run's output
            assert controlled["match_rate"] == 1.0 and 1 <= controlled["tokens_per_round"] <= 4
            assert controlled["expected_tokens_per_round"] == round((1 - 0.7**4) / 0.3, 3)
        assert spec[("suffix", batch, 0.0)]["match_rate"] == 1.0
    assert all(r["position"] is None for r in by["divergence"])  # float32 on the CPU: no near-tie parts them
    # the target as its own draft accepts everything: k + 1 tokens every round
    assert spec[("7b-self", 1, 0.0)]["tokens_per_round"] == 5.0
    arms = {(r["arm"], r["batch"]): r for r in by["scheduler"]}
    assert set(arms) == {
        (arm, batch) for arm in ("plain", "model", "sampled", "suffix", "mix") for batch in (1, 2)
    }
    assert all(r["eager_rounds"] == 0 and r["graph_rounds"] == r["steps"] > 0 for r in arms.values())
    assert "host_ms" in arms[("plain", 1)]
    assert "== summary ==" in run.stdout
