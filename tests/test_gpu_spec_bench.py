"""scripts/gpu_spec_bench.py in its CPU mode (tiny models, the torch reference attention, graphs run
eagerly, the Triton kernel interpreted): every section runs and reports, so that the GPU run it was
written for never spends device minutes on a Python error; the scheduler section's counts are real
(``capture=False``): every arm, the mix of arrivals included, on the graph path. A section that raises
is an error row and the run goes on (the sections' guard, and a failing fused check switching the run
to the unfused step, are checked with a planted failure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert not [r for r in rows if "error" in r]
    assert [r["section"] for r in rows if "skipped" in r] == ["warm"]  # the CPU run interprets the kernels
    sections = {
        "env",
        "plan",
        "copy",
        "kernel_error",
        "kernel_time",
        "build",
        "step",
        "ratios",
        "sampler",
        "plain",
    }
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
    # the fused step against the unfused one (float32 here: the same argmax, logits within 1e-4)
    assert {r["model"] for r in by["fused_check"]} == {"0.5b", "1.5b", "7b"}
    assert all(r["ok"] and r["argmax_agree"] == 1.0 and r["max_abs_diff"] < 1e-4 for r in by["fused_check"])
    assert by["plan"][0]["kv_tokens"]["7b"] >= 8 * (16 + 12)  # plain batch 8: prompt + tokens, each
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
    assert "== summary ==" in run.stdout and "errors in: none" in run.stdout


def test_a_failing_section_is_an_error_row_and_a_wrong_fused_step_is_switched_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_kernels
    import gpu_spec_bench
    import torch
    from trispec.engine.gpu import fused_step

    b = gpu_spec_bench.Bench(gpu_spec_bench.parse_args(["--device", "cpu", "--tiny", "--step", "fused"]))
    engine = b.engine("7b", 0, 16)
    engine.blocks.add(5, 8)
    engine.blocks.append(5, 8)
    assert b.section("step", lambda: 1 / 0) is None  # the next section starts with the whole pool
    error = b.rows[-1]
    assert error["section"] == "step" and error["error"].startswith("ZeroDivisionError")
    assert error["at"][-1].startswith("test_gpu_spec_bench.py") and 5 not in engine.blocks
    gpu_kernels.fused_check(b, {"7b": engine})
    assert b.rows[-1]["section"] == "fused_check" and b.rows[-1]["ok"] and b.fused
    # a wrong fused kernel (SiLU * up as zeros): its logits part from the unfused step's
    monkeypatch.setattr(
        fused_step, "silu_mul", lambda gate_up: torch.zeros_like(gate_up[:, : gate_up.shape[1] // 2])
    )
    gpu_kernels.fused_check(b, {"7b": engine})
    assert not b.fused and b.fused_failed
    check, switched = b.rows[-2:]
    assert not check["ok"] and check["max_rel_diff"] > 0.1
    assert switched == {**switched, "section": "fused_step_failed", "models": ["7b"]}
    assert engine.blocks.used_blocks == 0
