"""``specdec-bench-served`` without servers: its figures and ratios, llama-server's command line, the
same prompts and body for every arm in alternating order, the closed loop's clients, the offline arm on
a tiny pair, and the config it serves. The run against the real servers: test_bench_served_e2e.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_bench import tiny_pair
from trispec.bench import served_arms
from trispec.bench.llama_server import llama_server_command
from trispec.bench.machine import cpu_model, isa_flags
from trispec.bench.openai_stream import Completion
from trispec.bench.served import served_config, write_config
from trispec.bench.served_arms import arms, run_point
from trispec.bench.served_figures import (
    OFFLINE_PLAIN,
    OFFLINE_SPEC,
    OURS_PLAIN,
    OURS_SPEC,
    PEER_DRAFT,
    PEER_PLAIN,
    arm_row,
    arm_rows,
    ratio_row,
)
from trispec.bench.served_loop import ArmRun, offline_run, served_run
from trispec.bench.workloads import Workload
from trispec.config import load_config
from trispec.llm import SpeculativeLLM


def _run(elapsed: float, ttft: Sequence[float], decode_tokens: int, decode_s: float, tokens: int) -> ArmRun:
    return ArmRun(elapsed, tuple(ttft), decode_tokens, decode_s, tokens)


def test_an_arm_row_pools_its_repeats() -> None:
    runs = [_run(2.0, [0.1, 0.3], 30, 1.5, 32), _run(4.0, [0.2, 0.5], 30, 3.5, 32)]
    row = arm_row("humaneval", 2, OURS_PLAIN, runs)
    assert row["tok_s"] == pytest.approx(64 / 6.0, abs=1e-3)  # every token over the wall time
    assert row["tok_s_runs"] == [16.0, 8.0]
    assert row["decode_tok_s"] == pytest.approx(60 / 5.0, abs=1e-3)  # pooled, not a mean of rates
    assert row["ms_per_token"] == pytest.approx(1000 * 5.0 / 60, abs=1e-3)
    assert row["ttft_p50_s"] == pytest.approx(0.25)
    assert row["requests"] == 4 and row["tokens"] == 64


def _row(arm: str, tok_s: float, ms: float, clients: int = 1, workload: str = "humaneval") -> dict[str, Any]:
    return {"workload": workload, "clients": clients, "arm": arm, "tok_s": tok_s,
            "decode_tok_s": 1000 / ms, "ms_per_token": ms}  # fmt: skip


def test_ratios_are_between_arms_of_one_workload_and_client_count() -> None:
    rows = [
        _row(OURS_SPEC, 60.0, 10.0), _row(OURS_PLAIN, 30.0, 40.0), _row(PEER_PLAIN, 24.0, 41.0),
        _row(PEER_DRAFT, 20.0, 50.0), _row(OFFLINE_SPEC, 70.0, 8.0), _row(OFFLINE_PLAIN, 33.0, 30.0),
        _row(OURS_SPEC, 1.0, 1.0, clients=4),  # another point: never mixed in
    ]  # fmt: skip
    r = ratio_row(rows, "humaneval", 1)
    assert r["ours_vs_llama_server"] == 2.5 and r["ours_plain_vs_llama_server"] == 1.25
    assert r["ours_vs_ours_plain"] == 2.0 and r["llama_server_md_vs_plain"] == pytest.approx(0.8333, abs=1e-4)
    assert r["served_vs_offline"] == 0.8 and r["served_vs_offline_plain"] == 0.75  # decode a stream
    assert r["overhead_ms"] == 2.0 and r["overhead_ms_plain"] == 10.0  # served ms a token - offline's
    # without llama-server (no --llama-server): its ratios are None, ours still there
    alone = ratio_row([x for x in rows if not x["arm"].startswith("llama")], "humaneval", 1)
    assert alone["ours_vs_llama_server"] is None and alone["llama_server_md_vs_plain"] is None
    assert alone["ours_vs_ours_plain"] == 2.0


def test_the_all_workload_pools_each_repeat_over_the_workloads() -> None:
    code = [_run(2.0, [0.1], 10, 1.0, 11), _run(3.0, [0.1], 10, 1.0, 11)]
    chat = [_run(4.0, [0.3], 20, 3.0, 21), _run(5.0, [0.3], 20, 3.0, 21)]
    rows = arm_rows(
        {("humaneval", 1, OURS_SPEC): code, ("sharegpt", 1, OURS_SPEC): chat}, ["humaneval", "sharegpt"], [1]
    )
    pooled = [r for r in rows if r["workload"] == "all"]
    assert len(rows) == 3 and len(pooled) == 1
    assert pooled[0]["tok_s_runs"] == [pytest.approx(32 / 6.0, abs=1e-3), pytest.approx(32 / 8.0, abs=1e-3)]
    assert pooled[0]["decode_tok_s"] == pytest.approx(60 / 8.0, abs=1e-3)


def test_llama_server_command_for_slots_draft_and_no_prompt_cache() -> None:
    binary, target, draft = Path("/b/llama-server"), Path("/m/target.gguf"), Path("/m/draft.gguf")
    plain = llama_server_command(binary, target, threads=2, slots=4, context=4096, port=9, cache_prompt=False)
    assert plain[:3] == [str(binary), "-m", str(target)]
    flags = dict(zip(plain[3::2], plain[4::2]))
    assert flags["-t"] == "2" and flags["--parallel"] == "4" and flags["--port"] == "9"
    assert flags["-c"] == str(4 * 4096)  # -c is shared by the slots: each gets its context
    assert "--no-cache-prompt" in plain and plain[plain.index("--cache-ram") + 1] == "0"
    assert "-md" not in plain
    spec = llama_server_command(binary, target, threads=2, slots=1, context=2048, port=9, draft=draft)
    after = spec[spec.index("-md") :]
    # this llama.cpp drafts only with a --spec-type; --draft-max is gone (--spec-draft-n-max)
    assert after[:2] == ["-md", str(draft)]
    assert after[after.index("--spec-type") + 1] == "draft-simple"
    assert after[after.index("--spec-draft-n-max") + 1] == "4" and after[after.index("-td") + 1] == "2"
    assert "--draft-max" not in spec and "--no-cache-prompt" not in spec  # the multiturn peer caches


def _workload() -> Workload:
    return Workload("humaneval", [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [[10, 11], [12]])


def test_every_arm_gets_the_same_prompts_in_alternating_order() -> None:
    calls: list[tuple[str, Sequence[list[int]], int, int]] = []

    def fake(name: str) -> served_arms.ArmFn:
        def run(prompts: Sequence[list[int]], clients: int, max_tokens: int) -> ArmRun:
            calls.append((name, prompts, clients, max_tokens))
            return _run(1.0, [0.1], 1, 0.5, 2)

        return run

    names = ["a", "b", "c"]
    load = _workload()
    runs = run_point([(n, fake(n)) for n in names], load, 4, repeats=3, max_tokens=64, warmup_tokens=8)
    warmup, timed = calls[:3], calls[3:]
    assert [(c[0], c[1], c[2], c[3]) for c in warmup] == [(n, load.warmup, 1, 8) for n in names]
    assert [c[0] for c in timed] == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert all(c[1] == load.prompts and c[2] == 4 and c[3] == 64 for c in timed)
    assert {n: len(r) for n, r in runs.items()} == {"a": 3, "b": 3, "c": 3}


def test_the_served_arms_send_one_body_but_their_own_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: dict[str, list[dict[str, Any]]] = {}

    def capture(url: str, body: dict[str, Any], timeout_s: float = 0) -> Completion:
        bodies.setdefault(url, []).append(body)
        return Completion(0.0, 0.1, 0.2, body["max_tokens"], "x")

    monkeypatch.setattr(served_arms, "stream_completion", capture)
    peers = {PEER_PLAIN: ("http://peer", "t.gguf"), PEER_DRAFT: ("http://peer-md", "t.gguf")}
    every = arms("http://ours", "specdec", None, peers)  # type: ignore[arg-type]
    assert [n for n, _ in every] == [
        OURS_PLAIN,
        PEER_PLAIN,
        OFFLINE_PLAIN,
        OURS_SPEC,
        PEER_DRAFT,
        OFFLINE_SPEC,
    ]
    prompts = _workload().prompts
    for name, run in every:
        if not name.startswith("offline"):
            run(prompts, 2, 16)

    def same(url: str) -> list[str]:  # each body but its model and our k, in any order
        drop = ("model", "num_draft_tokens")
        return sorted(json.dumps({k: v for k, v in b.items() if k not in drop}) for b in bodies[url])

    assert same("http://ours") == sorted(same("http://peer") * 2) and same("http://peer") == same(
        "http://peer-md"
    )
    assert sorted(b["prompt"] for b in bodies["http://peer"]) == sorted(prompts)
    first = bodies["http://ours"][0]
    assert first["ignore_eos"] is True and first["temperature"] == 0.0 and first["stream"] is True
    ours_k = [b.get("num_draft_tokens") for b in bodies["http://ours"]]
    assert ours_k == [0] * 3 + [None] * 3  # plain, then the config's default
    assert all("num_draft_tokens" not in b for b in bodies["http://peer"] + bodies["http://peer-md"])


def test_served_run_keeps_clients_in_flight_and_refuses_short_answers() -> None:
    both_in_flight = threading.Barrier(2, timeout=60)  # only two clients at once get past it

    def send(prompt: list[int]) -> Completion:
        both_in_flight.wait()
        return Completion(0.0, 0.1, 0.5, 8, "text")

    run = served_run(send, [[1], [2], [3], [4]], 2, 8)
    assert run.tokens == 32 and run.decode_tokens == 28 and len(run.ttft_s) == 4
    with pytest.raises(RuntimeError, match="not max_tokens 9"):
        served_run(lambda p: Completion(0.0, 0.1, 0.5, 8, "text"), [[1]], 1, 9)


def test_offline_arm_ignores_the_end_token_at_k0_and_the_default(tmp_path: Path) -> None:
    config = served_config(load_config(tiny_pair(tmp_path)), 1)
    llm = SpeculativeLLM.from_config(config)
    for k in (0, None):
        run = offline_run(llm.engine, [[5, 17, 33], [6, 17]], 2, 12, k)
        assert run.tokens == 24 and run.decode_tokens == 22 and len(run.ttft_s) == 2


def test_the_served_config_computes_every_prompt_on_the_bench_threads(tmp_path: Path) -> None:
    config = served_config(load_config(tiny_pair(tmp_path)), 3)
    assert config.scheduler.prefix_caching is False and config.num_threads == 3
    (tmp_path / "elsewhere").mkdir()
    # written away from the original: its checkpoint paths still resolve
    assert load_config(write_config(config, tmp_path / "elsewhere" / "c.yaml")) == config


def test_machine_header_reads_cpuinfo() -> None:
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 fma avx512f avx512_vnni\n"
    assert cpu_model(cpuinfo) == "AMD EPYC 9R14"
    assert isa_flags(cpuinfo) == ["avx2", "fma", "avx512f", "avx512_vnni"]
