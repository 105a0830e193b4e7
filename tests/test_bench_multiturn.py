"""``specdec-bench --workloads multiturn`` on a tiny pair (no chat template: a transcript): every
scenario's rows and summaries, the prefix cache's hits, and under pool pressure a prompt longer than
the pool refused in its row while the rest is served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench import tiny_pair
from trispec.bench import workloads
from trispec.bench.speculative import main

ARGS = ["--workloads", "multiturn", "--turns", "2", "--users", "2", "--max-tokens", "4"]
ARGS += ["--system-tokens", "40", "--repeat-tokens", "200", "--json", "--threads", "1"]


def _rows(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> list[dict]:
    try:
        workloads.humaneval_path(), workloads.sharegpt_path()
    except workloads.WorkloadDataMissing as exc:
        pytest.skip(f"workload data not installed: {exc}")
    assert main(["--config", str(tiny_pair(tmp_path)), *ARGS, *extra]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_every_scenario_runs_and_later_turns_hit_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _rows(tmp_path, capsys)
    turns = [r for r in rows if r["row"] == "multiturn"]
    summaries = {r["scenario"]: r for r in rows if r["row"] == "multiturn_summary"}
    assert set(summaries) == {"one-user", "interleaved", "shared-system", "repeat", "cold"}
    one = [r for r in turns if r["scenario"] == "one-user"]
    assert [r["turn"] for r in one] == [1, 2] and one[0]["cached_tokens"] == 0
    # turn 2 finds turn 1's prompt: it computes only what is new since
    assert one[1]["cached_tokens"] >= one[0]["prompt_tokens"] - 16
    assert one[1]["computed_tokens"] == one[1]["prompt_tokens"] - one[1]["cached_tokens"]
    repeat = [r for r in turns if r["scenario"] == "repeat"]
    assert repeat[1]["computed_tokens"] == 1 and repeat[1]["prompt_tokens"] == repeat[0]["prompt_tokens"]
    assert summaries["one-user"]["computed_over_new"] <= 1.1
    assert summaries["cold"]["cached_tokens_max_on"] < 16  # cold prompts share no block


def test_under_pool_pressure_what_cannot_fit_is_refused_and_the_rest_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a pool of ~400 tokens: each conversation fits, two side by side do not, the repeated prompt never
    rows = _rows(tmp_path, capsys, "--kv-cache-mb", "0.2")
    refused = [r for r in rows if r["row"] == "multiturn_refused"]
    assert [r["scenario"] for r in refused] == ["repeat"]
    assert (
        refused[0]["reason"].startswith("prompt_token_ids:")
        and "longer than the context" in refused[0]["reason"]
    )
    turns = [r for r in rows if r["row"] == "multiturn"]
    assert {r["scenario"] for r in turns} == {"one-user", "interleaved", "shared-system"}
    assert all(r["output_tokens"] == 4 for r in turns)
    summaries = {r["scenario"] for r in rows if r["row"] == "multiturn_summary"}
    assert summaries == {"one-user", "interleaved", "shared-system", "cold"}
