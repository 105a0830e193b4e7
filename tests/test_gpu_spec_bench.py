"""scripts/gpu_spec_bench.py in its CPU mode (tiny models, the torch reference attention, graphs run
eagerly, the Triton kernel interpreted): every section runs and reports, so that the GPU run it was
written for never spends device minutes on a Python error."""

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
    assert {"env", "copy", "kernel_error", "kernel_time", "build", "step", "ratios", "plain", "spec"} <= set(
        by
    )
    assert len(by["kernel_error"]) == 6 and all(r["max_rel_err"] < 1e-4 for r in by["kernel_error"])
    assert len(by["step"]) == 3 * 2 * 2  # models x batches x (decode, verify) at the one tiny context
    assert all(r["graph_ms"] > 0 and r["eager_ms"] > 0 for r in by["step"])
    assert {"c_0.5b_7b", "verify_over_decode_7b"} <= set(by["ratios"][0])
    assert [r["path"] for r in by["plain"]] == ["graph", "graph", "eager"]
    controlled, self_draft = by["spec"]
    assert controlled["match_rate"] == 1.0 and 1 <= controlled["tokens_per_round"] <= 4
    assert controlled["expected_tokens_per_round"] == round((1 - 0.7**4) / 0.3, 3)
    # the target as its own draft accepts everything: k + 1 tokens every round
    assert self_draft["tokens_per_round"] == 5.0 and self_draft["match_rate"] == 1.0
    assert "== summary ==" in run.stdout
