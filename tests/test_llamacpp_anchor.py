"""``specdec-bench --anchor-llamacpp``: llama-bench's JSON lines read into an anchor, and each arm at
one request put against it (a stand-in llama-bench script: no llama.cpp build in the tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trispec.bench.llamacpp import run_llama_bench
from trispec.bench.report import Reporter


# llama-bench `-o jsonl` writes one object per test with test::get_fields() as keys (build_commit,
# n_prompt, n_gen, ..., avg_ts): llama.cpp tools/llama-bench/llama-bench.cpp; the real binary was run
# for docs/benchmarks.md's anchor, this stand-in keeps the tests without a llama.cpp build.
def fake_llama_bench(tmp_path: Path, lines: list[dict]) -> Path:
    script = tmp_path / "llama-bench"
    echoes = "\n".join(f"echo '{json.dumps(line)}'" for line in lines)
    script.write_text(f"#!/bin/sh\n{echoes}\n")
    script.chmod(0o755)
    return script


ROWS = [
    {
        "workload": "humaneval",
        "concurrency": 1,
        "arm": "plain",
        "tok_s": 30.0,
        "decode_tok_s": 40.0,
        "ttft_s": {"p50": 0.5},
    },
    {
        "workload": "humaneval",
        "concurrency": 8,
        "arm": "plain",
        "tok_s": 90.0,
        "decode_tok_s": 99.0,
        "ttft_s": {},
    },
]


def test_pp_and_tg_read_and_each_arm_put_against_tg(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    binary = fake_llama_bench(
        tmp_path,
        [
            {"build_commit": "abc123", "n_prompt": 111, "n_gen": 0, "avg_ts": 150.0},
            {"build_commit": "abc123", "n_prompt": 0, "n_gen": 64, "avg_ts": 36.0},
        ],
    )
    anchor = run_llama_bench(binary, tmp_path / "m.gguf", threads=2, n_gen=64)
    assert (anchor.prompt_tok_s, anchor.decode_tok_s, anchor.build) == (150.0, 36.0, "abc123")
    reporter = Reporter(json_lines=True)
    reporter.llamacpp("target", anchor)
    reporter.against_llamacpp(ROWS, anchor)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["row"] == "llamacpp" and lines[0]["tg_tok_s"] == 36.0
    assert [line["row"] for line in lines[1:]] == ["vs_llamacpp"]  # one request only
    assert lines[1]["decode_tok_s_vs_tg"] == round(40 / 36, 3) and lines[1]["tok_s_vs_tg"] == round(
        30 / 36, 3
    )
    Reporter(json_lines=False).against_llamacpp(ROWS, anchor)
    assert "1.11x" in capsys.readouterr().out


def test_a_failing_or_silent_llama_bench_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no pp/tg"):
        run_llama_bench(fake_llama_bench(tmp_path, []), tmp_path / "m.gguf", threads=2, n_gen=64)
