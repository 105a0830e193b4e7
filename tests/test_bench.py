"""specdec-bench's pieces on tiny models: arm names and drafter variants, the closed loop, the rows
it prints, and one whole run through ``main`` on a tiny pair (workloads need the ``bench`` extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_llm import save_tiny_checkpoint
from tiny import TINY_VOCAB, model_drafter, spec_engine, tiny_engine
from trispec.bench import engine as engine_bench
from trispec.bench import memory, workloads
from trispec.bench.arms import Arm, default_drafters, make_arms, variant
from trispec.bench.closed_loop import LoopResult, run_closed_loop
from trispec.bench.speculative import (
    MAX_REPEATS,
    MAX_WARMUP_RUNS,
    Bench,
    Workload,
    _combined_runs,
    main,
    parse_ints,
    row,
    run_point,
)
from trispec.config import SpecDecConfig, load_config
from trispec.drafters.ngram import NgramDrafter
from trispec.errors import ConfigError
from trispec.stats import EngineStats

RUN_KEYS = {"workload", "concurrency", "arm", "tok_s", "speedup_vs_plain", "acceptance", "identical_to_plain"}


def pair_config(draft: bool = True) -> SpecDecConfig:
    drafter = {"kind": "model", "model": {"checkpoint": {"path": "/tmp/d"}}} if draft else {"kind": "ngram"}
    return SpecDecConfig.model_validate({"target": {"checkpoint": {"path": "/tmp/t"}}, "drafter": drafter})


def test_arm_names() -> None:
    names = [a.name for a in make_arms(["model-int8", "suffix"], [2, 4], adaptive=True, fixed=True)]
    assert names == [
        "plain",
        "model-int8-k2",
        "model-int8-k4",
        "model-int8-adaptive",
        "suffix-k2",
        "suffix-k4",
        "suffix-adaptive",
    ]
    adaptive = make_arms(["ngram"], [2, 6], adaptive=True, fixed=False)
    assert adaptive == [Arm("plain", None, 0, False), Arm("ngram-adaptive", "ngram", 6, True)]


def test_drafter_variants() -> None:
    config = pair_config()
    assert default_drafters(config) == ["model", "suffix"]
    int8 = variant(config, "model-int8").drafter
    assert (int8.kind, int8.precision, int8.with_suffix) == ("model", "int8", False)
    both = variant(config, "model-bf16+suffix").drafter
    assert (both.precision, both.with_suffix) == ("bfloat16", True)
    assert variant(config, "model-fp32").drafter.model.dtype == "float32"
    selfdraft = variant(config, "self-int8").drafter
    assert (selfdraft.kind, selfdraft.model) == ("self", None)
    assert variant(config, "suffix").drafter.kind == "suffix"
    head = variant(config, "model-int8/4096+suffix").drafter
    assert (head.precision, head.draft_vocab, head.with_suffix) == ("int8", 4096, True)
    assert variant(config, "self-int8/100").drafter.draft_vocab == 100
    assert variant(variant(config, "model/64"), "model/full").drafter.draft_vocab is None
    assert variant(variant(config, "model/64"), "model").drafter.draft_vocab == 64  # the config's own


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("model-int4", "precision"),
        ("ngram+suffix", "model drafter"),
        ("eagle", "unknown drafter"),
        ("suffix/100", "goes with a model drafter"),
        ("model/0", "positive number or 'full'"),
        ("model/many", "positive number or 'full'"),
    ],
)
def test_bad_drafter_names(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        variant(pair_config(), name)


def test_model_drafter_needs_a_model_section() -> None:
    with pytest.raises(ConfigError, match=r"drafter\.model"):
        variant(pair_config(draft=False), "model-int8")


@pytest.mark.parametrize(("text", "ok"), [("1,2,4", [1, 2, 4]), ("0", None), ("a,b", None), ("", None)])
def test_parse_ints(text: str, ok: list[int] | None) -> None:
    if ok is None:
        with pytest.raises(SystemExit):
            parse_ints(text, "--concurrency")
    else:
        assert parse_ints(text, "--concurrency") == ok


PROMPTS = [[5 + i, 17, 33, 5 + i, 17, 33, 5 + i] for i in range(5)]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_closed_loop_is_exact_and_keeps_concurrency(concurrency: int) -> None:
    plain = run_closed_loop(
        spec_engine(tiny_engine(0), None), PROMPTS, concurrency=concurrency, max_tokens=9, num_draft_tokens=0
    )
    llm = spec_engine(tiny_engine(0), model_drafter(0))
    finished: list[int] = []  # running sequences when each request finished
    result = run_closed_loop(
        llm,
        PROMPTS,
        concurrency=concurrency,
        max_tokens=9,
        num_draft_tokens=3,
        on_finish=lambda: finished.append(len(llm.scheduler.running)),
    )
    assert [len(t) for t in result.token_ids] == [9] * len(PROMPTS)
    assert result.token_ids == plain.token_ids  # the same draft model: every draft accepted
    assert len(result.ttft_s) == len(PROMPTS) and len(result.itl_s) == len(PROMPTS)
    assert len(finished) == len(PROMPTS)
    assert result.stats.max_verify_batch == min(concurrency, len(PROMPTS))  # in-flight batching
    assert result.stats.acceptance_rate == 1.0


def test_closed_loop_takes_each_prompt_s_max_tokens() -> None:
    lengths = [3, 7, 1, 5, 2]
    result = run_closed_loop(
        spec_engine(tiny_engine(0), None), PROMPTS, concurrency=2, max_tokens=lengths, num_draft_tokens=0
    )
    assert [len(t) for t in result.token_ids] == lengths


def test_row_fields_and_identity_check() -> None:
    plain_arm, arm = Arm("plain", None, 0, False), Arm("ngram-k2", "ngram", 2, False)
    plain_result = run_closed_loop(
        spec_engine(tiny_engine(0), None), PROMPTS, concurrency=2, max_tokens=6, num_draft_tokens=0
    )
    plain = row("w", 2, plain_arm, plain_result, None)
    spec_result = run_closed_loop(
        spec_engine(tiny_engine(0), NgramDrafter(TINY_VOCAB)),
        PROMPTS,
        concurrency=2,
        max_tokens=6,
        num_draft_tokens=2,
    )
    spec = row("w", 2, arm, spec_result, plain)
    assert set(spec) >= RUN_KEYS
    assert spec["identical_to_plain"] is True and plain["identical_to_plain"] is None
    assert spec["speedup_vs_plain"] == pytest.approx(spec["tok_s"] / plain["tok_s"], rel=1e-3)
    assert 0.0 <= spec["acceptance"] <= 1.0 and plain["acceptance"] is None
    assert 0 < spec["mean_k"] <= 2
    # a different output is reported, not hidden
    spec_result.token_ids[0][-1] += 1
    assert row("w", 2, arm, spec_result, plain)["identical_to_plain"] is False


def tiny_pair(tmp_path: Path, same_weights: bool = True) -> Path:
    save_tiny_checkpoint(tmp_path / "target", 320, seed=0)
    # the same weights: greedy drafts always accepted; other weights: a draft that disagrees often
    save_tiny_checkpoint(tmp_path / "draft", 320, seed=0 if same_weights else 1)
    config = tmp_path / "pair.yaml"
    config.write_text(
        "target: {checkpoint: {path: target}, kv_cache_mb: 4}\n"
        "drafter: {kind: model, model: {checkpoint: {path: draft}, kv_cache_mb: 4}}\n"
        "scheduler: {max_context: 1024}\n"
    )
    return config


def test_warm_up_leaves_an_adaptive_arm_warm(tmp_path: Path) -> None:
    # the controller's warm-up must not spill into the first timed run: it takes more than one
    # warm-up run here, and the bench runs as many as it takes
    bench = Bench(load_config(tiny_pair(tmp_path)), 2, 64, 2)
    load = Workload("w", PROMPTS[:3], PROMPTS[3:])
    plain, adaptive = make_arms(["model"], [2], adaptive=True, fixed=False)
    assert bench.warm_up(plain, load) == 1
    assert 1 < bench.warm_up(adaptive, load) <= MAX_WARMUP_RUNS
    controller = bench.engine(adaptive, "w").scheduler.controller
    assert controller is not None and controller.warm


def test_main_on_a_tiny_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "PROBE_BYTES", 32 << 20)  # the floor's read probe, small for a test
    try:
        workloads.humaneval_path()
    except workloads.WorkloadDataMissing as exc:
        pytest.skip(f"bench extra not installed: {exc}")
    config = tiny_pair(tmp_path)
    load_config(config)
    argv = ["--config", str(config), "--workloads", "humaneval,edit", "--concurrency", "1,2", "--k", "2"]
    argv += [
        "--drafters",
        "model,suffix",
        "--num-prompts",
        "3",
        "--max-tokens",
        "5",
        "--json",
        "--threads",
        "1",
        "--repeats",
        "2",
    ]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = [r for r in lines if r["row"] == "run"]
    arms = ["plain", "model-k2", "model-adaptive", "suffix-k2", "suffix-adaptive"]
    points = [(c, a) for c in (1, 2) for a in arms]
    assert [(r["workload"], r["concurrency"], r["arm"]) for r in runs] == [
        (w, c, a) for w in ("humaneval", "edit", "all") for c, a in points
    ]
    for r in runs:
        assert set(r) >= RUN_KEYS
        assert r["identical_to_plain"] is (None if r["arm"] == "plain" else True)
        assert r["tokens"] == 2 * 3 * 5 * (2 if r["workload"] == "all" else 1)  # 2 repeats
    assert all(r["acceptance"] == 1.0 for r in runs if r["arm"] == "model-k2")
    mixed = {(r["concurrency"], r["arm"]): r for r in runs if r["workload"] == "all"}
    assert mixed[(1, "model-k2")]["speedup_vs_plain"] == pytest.approx(
        mixed[(1, "model-k2")]["tok_s"] / mixed[(1, "plain")]["tok_s"], rel=1e-3
    )
    assert [r["drafter"] for r in lines if r["row"] == "draft_cost"] == ["model"]
    # the memory rows: the target and the model drafter, every one-request arm against the floor
    floors = {r["role"]: r for r in lines if r["row"] == "memory"}
    assert set(floors) == {"target", "draft model"}
    target = floors["target"]
    assert target["bytes"]["total"] > 0 and target["read_gb_s"] > 0 and target["floor_ms"] > 0
    one_request = {
        f"{r['workload']}/{r['arm']}" for r in runs if r["concurrency"] == 1 and r["workload"] != "all"
    }
    assert set(target["figures"]) == {"engine_step", *one_request}
    assert "host" not in target  # a dense model runs layer by layer: no kernel clock


def test_main_refuses_unknown_drafter_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="unknown drafter"):
        main(["--drafters", "eagle"])


@pytest.mark.parametrize("names", ["foo", ",", "humaneval,foo"])
def test_main_refuses_unknown_workloads_before_loading(names: str) -> None:
    with pytest.raises(SystemExit, match="--workloads: comma-separated names from humaneval, sharegpt, edit"):
        main(["--workloads", names])


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--new-tokens", "0"], ["--threads", "0"]])
def test_engine_bench_refuses_bad_counts(argv: list[str]) -> None:
    with pytest.raises(SystemExit, match="must be >= 1"):
        engine_bench.main([*argv, "--no-hf"])


def test_engine_bench_reports_a_bad_checkpoint_as_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"config error: checkpoint: .*expected a \.gguf file"):
        engine_bench.main(["--checkpoint", str(tmp_path / "missing.gguf"), "--no-hf"])


def timed_runs(seconds: dict[str, float]):
    """A run function for ``run_point`` whose runs take the given seconds per arm; it logs the order."""
    order: list[str] = []

    def run(arm: Arm) -> LoopResult:
        order.append(arm.name)
        return LoopResult(seconds[arm.name], [[1]], [0.1], [], EngineStats())

    return run, order


ARMS = make_arms(["suffix"], [4], adaptive=True, fixed=False)  # plain, suffix-adaptive


def test_a_point_runs_its_repeats_in_alternating_order() -> None:
    run, order = timed_runs({"plain": 1.0, "suffix-adaptive": 2.0})
    runs = run_point(ARMS, run, repeats=3)
    a, b = "plain", "suffix-adaptive"
    assert order == [a, b, b, a, a, b]
    assert [len(r) for r in runs.values()] == [3, 3]


def test_min_seconds_adds_rounds_in_pairs_until_every_arm_ran_that_long() -> None:
    extra: list[int] = []
    run, order = timed_runs({"plain": 1.0, "suffix-adaptive": 2.0})
    runs = run_point(ARMS, run, repeats=1, min_seconds=3.5, on_extra_repeat=lambda: extra.append(1))
    # plain needs 4 rounds of 1 s; the 1 asked for, then pairs
    assert [len(r) for r in runs.values()] == [5, 5] and len(extra) == 4
    assert order[:4] == ["plain", "suffix-adaptive", "suffix-adaptive", "plain"]
    # already long enough: no round more than asked
    run, order = timed_runs({"plain": 9.0, "suffix-adaptive": 9.0})
    assert [len(r) for r in run_point(ARMS, run, repeats=1, min_seconds=3.5).values()] == [1, 1]
    # and never more than MAX_REPEATS
    run, order = timed_runs({"plain": 0.001, "suffix-adaptive": 0.001})
    assert len(run_point(ARMS, run, repeats=2, min_seconds=60).popitem()[1]) == MAX_REPEATS


def test_repeats_merge_into_one_result() -> None:
    runs = [
        run_closed_loop(
            spec_engine(tiny_engine(0), NgramDrafter(TINY_VOCAB)),
            PROMPTS,
            concurrency=2,
            max_tokens=6,
            num_draft_tokens=2,
        )
        for _ in range(3)
    ]
    merged = LoopResult.merged(runs)
    assert merged.num_tokens == 3 * runs[0].num_tokens
    assert merged.elapsed_s == pytest.approx(sum(r.elapsed_s for r in runs))
    assert merged.stats.draft_tokens == 3 * runs[0].stats.draft_tokens
    assert merged.stats.drafted_per_position == [3 * n for n in runs[0].stats.drafted_per_position]
    assert merged.repeats_agree and len(merged.ttft_s) == 3 * len(PROMPTS)
    assert merged.tok_s_runs == pytest.approx([r.tok_s for r in runs])  # each repeat's own rate
    assert min(merged.tok_s_runs) <= merged.tok_s <= max(merged.tok_s_runs)
    runs[1].token_ids[0][0] += 1
    assert not LoopResult.merged(runs).repeats_agree


def test_combined_repeats_add_up_each_repeat_over_the_workloads() -> None:
    # repeat 0: 100 tokens in 10 s and 200 in 5 s; repeat 1: 100 in 5 s and 200 in 10 s
    group = [{"tokens": 200, "tok_s_runs": [10.0, 20.0]}, {"tokens": 400, "tok_s_runs": [40.0, 20.0]}]
    assert _combined_runs(group) == [20.0, 20.0]
    uneven = [{"tokens": 10, "tok_s_runs": [1.0]}, {"tokens": 10, "tok_s_runs": [1.0, 2.0]}]
    assert _combined_runs(uneven) == []


@pytest.mark.parametrize(("rule", "identical"), [("coupled", True), ("rejection", False)])
def test_sampled_arms_give_plains_tokens_under_the_coupled_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rule: str, identical: bool
) -> None:
    """--temperature: every request seeded (the same seed per prompt in every arm); under the coupled
    rule every arm's tokens are plain's, under the rejection rule the fixed-k arm's are not."""
    try:
        workloads.humaneval_path()
    except workloads.WorkloadDataMissing as exc:
        pytest.skip(f"bench extra not installed: {exc}")
    config = tiny_pair(tmp_path, same_weights=False)
    argv = ["--config", str(config), "--workloads", "humaneval", "--concurrency", "2", "--k", "3"]
    argv += ["--drafters", "model", "--num-prompts", "4", "--max-tokens", "12", "--json", "--threads", "1"]
    argv += ["--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--sampling-rule", rule]
    argv += ["--no-memory-floor"]
    assert main(argv) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    by_arm = {r["arm"]: r for r in runs if r.get("row") == "run"}
    assert by_arm["model-k3"]["identical_to_plain"] is identical
    assert by_arm["model-k3"]["accepted_tokens"] > 0
    if identical:
        assert by_arm["model-adaptive"]["identical_to_plain"] is True


@pytest.mark.parametrize("flag", ["--anchor-llamacpp", "--llama-server"])
def test_a_missing_peer_binary_is_refused_before_loading(flag: str, tmp_path: Path) -> None:
    workloads = ["--workloads", "multiturn"] if flag == "--llama-server" else []
    with pytest.raises(SystemExit, match=f"{flag}: no executable at .*missing.*builds one"):
        main([*workloads, flag, str(tmp_path / "missing")])


def test_a_draft_vocabulary_past_the_drafts_is_a_config_error(tmp_path: Path) -> None:
    """Only the checkpoint knows the draft's vocabulary: refused once it is read, by name, no traceback."""
    argv = ["--config", str(tiny_pair(tmp_path, same_weights=False)), "--workloads", "humaneval"]
    argv += ["--drafters", "model/1000000", "--num-prompts", "1", "--max-tokens", "2", "--threads", "1"]
    with pytest.raises(SystemExit, match=r"config error: drafter.draft_vocab: 1000000 exceeds the draft"):
        main(argv)


def test_bad_sampling_flags_are_refused_before_loading() -> None:
    with pytest.raises(SystemExit, match="--top-p"):
        main(["--temperature", "0.7", "--top-p", "1.5"])


@pytest.mark.parametrize("grammar_drafts", [True, False])
def test_main_runs_the_json_workload_guided_and_unguided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, grammar_drafts: bool
) -> None:
    """Schema-guided prompts (json) and the same unguided (json_free): every arm, plain's tokens; each
    unguided request stops at its guided answer's length, so guided_vs_unguided compares equal work."""
    lengths: dict[str, list[list[int]]] = {}
    original_run = Bench.run

    def run(self: Bench, arm: Arm, **kw: Any) -> LoopResult:
        result = original_run(self, arm, **kw)
        if kw["load"].name == "json":  # a random model never closes its JSON: answers of 1, 2, 3 tokens
            result.token_ids = [t[: i + 1] for i, t in enumerate(result.token_ids)]
        lengths.setdefault(kw["load"].name, []).append([len(t) for t in result.token_ids])
        return result

    monkeypatch.setattr(Bench, "run", run)
    argv = ["--config", str(tiny_pair(tmp_path, same_weights=False)), "--workloads", "json_free,json"]
    argv += ["--concurrency", "1", "--k", "2", "--drafters", "model", "--arms", "fixed", "--num-prompts", "3"]
    argv += ["--max-tokens", "24", "--json", "--threads", "1"]
    assert main(argv + ([] if grammar_drafts else ["--no-grammar-drafts"])) == 0
    runs = [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if r["row"] == "run"]
    assert [(r["workload"], r["arm"]) for r in runs] == [
        (w, a) for w in ("json", "json_free", "all") for a in ("plain", "model-k2")
    ]  # json first whatever the order asked: json_free takes its lengths
    assert all(r["identical_to_plain"] is True for r in runs if r["arm"] == "model-k2")
    guided_lengths = lengths["json"][0]
    assert guided_lengths == [1, 2, 3]
    assert all(run == guided_lengths for run in lengths["json"] + lengths["json_free"])
    guided = {r["arm"]: r for r in runs if r["workload"] == "json"}
    for r in runs:
        if r["workload"] == "json_free":
            assert r["tokens"] == guided[r["arm"]]["tokens"] == sum(guided_lengths)
            assert r["guided_vs_unguided"] == pytest.approx(guided[r["arm"]]["tok_s"] / r["tok_s"], rel=1e-3)


def test_json_free_alone_runs_to_max_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a json run to take lengths from, unguided requests make --max-tokens each."""
    argv = ["--config", str(tiny_pair(tmp_path, same_weights=False)), "--workloads", "json_free"]
    argv += ["--concurrency", "1", "--k", "2", "--drafters", "model", "--arms", "fixed", "--num-prompts", "2"]
    assert main([*argv, "--max-tokens", "12", "--json", "--threads", "1"]) == 0
    runs = [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if r["row"] == "run"]
    assert {r["arm"]: r["tokens"] for r in runs} == {"plain": 2 * 12, "model-k2": 2 * 12}
    assert all("guided_vs_unguided" not in r for r in runs)
