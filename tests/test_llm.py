"""The YAML-to-stack wiring and the offline CLI, on tiny HF-layout safetensors checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tiny import ascii_tokenizer, tiny_args
from trispec.cli.generate import main as generate_main
from trispec.config import load_config
from trispec.drafters.ngram import ngram_lookup
from trispec.engine.cpu.linear import DenseLinear, Int8Linear
from trispec.errors import ConfigError
from trispec.llm import SpeculativeLLM


def save_tiny_checkpoint(folder: Path, vocab_size: int, seed: int) -> Path:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**tiny_args(vocab_size=vocab_size).to_hf_config())
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    ascii_tokenizer(vocab_size).backend.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint(root / "target", 320, seed=0)
    save_tiny_checkpoint(root / "draft", 320, seed=1)
    save_tiny_checkpoint(root / "other_vocab", 400, seed=2)
    return root


def write_config(root: Path, drafter: str) -> Path:
    path = root / f"config-{abs(hash(drafter))}.yaml"
    path.write_text(
        f"target:\n  checkpoint:\n    path: target\n  kv_cache_mb: 8\n{drafter}"
        # adaptive speculation chooses by measured time: these tests are about exactness and drafting
        "scheduler:\n  max_context: 256\n  adaptive_speculation: false\n"
    )
    return path


def test_model_drafter_from_yaml_is_exact(checkpoints: Path) -> None:
    plain = SpeculativeLLM.from_config(load_config(write_config(checkpoints, "drafter:\n  kind: none\n")))
    spec = SpeculativeLLM.from_config(
        load_config(
            write_config(
                checkpoints, "drafter:\n  kind: model\n  model:\n    checkpoint:\n      path: draft\n"
            )
        )
    )
    prompts = ["hello world", "the rain in spain", "abcabcabc"]
    expected = plain.generate([plain.request(p, max_tokens=20) for p in prompts])
    got = spec.generate([spec.request(p, max_tokens=20, num_draft_tokens=3) for p in prompts])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.text for r in got] == [r.text for r in expected]
    assert all(r.stats.draft_tokens > 0 for r in got)
    assert all(r.stats.draft_tokens == 0 for r in expected)


MODEL_DRAFT = "drafter:\n  kind: model\n  model:\n    checkpoint:\n      path: draft\n"


@pytest.mark.parametrize(
    ("drafter_yaml", "drafter_type", "draft_dtype"),
    [
        ("drafter:\n  kind: suffix\n", "SuffixDrafter", None),
        (MODEL_DRAFT + "  precision: int8\n", "ModelDrafter", "int8"),
        (MODEL_DRAFT + "  precision: bfloat16\n", "ModelDrafter", torch.bfloat16),
        (MODEL_DRAFT + "  with_suffix: true\n", "WithSuffix", torch.float32),
        ("drafter:\n  kind: self\n  precision: int8\n  with_suffix: true\n", "WithSuffix", "int8"),
    ],
)
def test_drafter_kinds_from_yaml_are_exact(
    checkpoints: Path, drafter_yaml: str, drafter_type: str, draft_dtype: object
) -> None:
    """Every drafter a YAML can name builds as named (int8 weights for ``precision: int8`` on a
    separate draft model too) and gives the plain output under greedy."""
    plain = SpeculativeLLM.from_config(load_config(write_config(checkpoints, "drafter:\n  kind: none\n")))
    spec = SpeculativeLLM.from_config(load_config(write_config(checkpoints, drafter_yaml)))
    drafter = spec.engine.runner.drafter
    assert type(drafter).__name__ == drafter_type
    model_drafter = getattr(drafter, "model", drafter)
    if draft_dtype is not None:
        model = model_drafter.engine.model
        linears = [getattr(layer, name) for layer in model.layers for name in ("qkv", "o", "gate_up", "down")]
        if draft_dtype == "int8":
            assert all(isinstance(m, Int8Linear) for m in linears)
        else:
            assert all(isinstance(m, DenseLinear) for m in linears)
            assert model.dtype == draft_dtype
    # repeated text, so that the suffix index has something to match
    prompts = ["hello world hello world hello", "the rain in spain, the rain in", "abcabcabcabc"]
    expected = plain.generate([plain.request(p, max_tokens=24) for p in prompts])
    got = spec.generate([spec.request(p, max_tokens=24, num_draft_tokens=4) for p in prompts])
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert sum(r.stats.draft_tokens for r in got) > 0
    if "kind: model" not in drafter_yaml:  # a random draft model of another seed never agrees
        assert sum(r.stats.accepted_tokens for r in got) > 0


def test_draft_with_another_vocabulary_is_rejected(checkpoints: Path) -> None:
    config = load_config(
        write_config(
            checkpoints, "drafter:\n  kind: model\n  model:\n    checkpoint:\n      path: other_vocab\n"
        )
    )
    with pytest.raises(ConfigError) as info:
        SpeculativeLLM.from_config(config)
    assert info.value.field == "drafter.model.checkpoint"
    assert "vocabular" in str(info.value) or "tokenizer" in str(info.value)


def test_cli_json_output(checkpoints: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(checkpoints, "drafter:\n  kind: ngram\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abab abab abab"}\n{"prompt": "hello"}\n')
    code = generate_main(
        [
            "--config",
            str(config),
            "--prompts-file",
            str(prompts),
            "--max-tokens",
            "12",
            "--num-draft-tokens",
            "3",
            "--json",
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == ["abab abab abab", "hello"]
    for line in lines:
        assert len(line["token_ids"]) == 12
        assert set(line["stats"]) == {
            "draft_tokens",
            "accepted_tokens",
            "rounds",
            "acceptance_rate",
            "mean_accepted_length",
            "mean_num_draft_tokens",
            "accepted_per_position",
        }
        stats = line["stats"]
        assert stats["mean_accepted_length"] == pytest.approx(
            1 + stats["accepted_tokens"] / stats["rounds"], abs=1e-5
        )


def test_cli_bad_input_exits_2(checkpoints: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(checkpoints, "drafter:\n  kind: ngram\n")
    assert generate_main(["--config", str(config), "--prompt", "hi", "--top-p", "0"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert generate_main(["--config", str(config), "--prompt", "hi", "--num-draft-tokens", "99"]) == 2
    assert "num_draft_tokens" in capsys.readouterr().err
    missing = checkpoints / "missing.jsonl"
    assert generate_main(["--config", str(config), "--prompts-file", str(missing)]) == 2
    assert f"prompts_file: cannot read {missing}" in capsys.readouterr().err


def test_ngram_lookup() -> None:
    assert ngram_lookup([1, 2, 3, 9, 1, 2], k=3, max_ngram=3, min_ngram=1) == [3, 9, 1]
    assert ngram_lookup([5, 6, 7], k=2, max_ngram=3, min_ngram=1) == []
    # the most recent match wins
    assert ngram_lookup([1, 4, 1, 5, 1], k=1, max_ngram=1, min_ngram=1) == [5]
    assert ngram_lookup([1, 2, 1, 2], k=0, max_ngram=2, min_ngram=1) == []


def test_build_prepares_and_checks_the_pair(checkpoints: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trispec_build.cli import main as build_main

    good = write_config(
        checkpoints, "drafter:\n  kind: model\n  model:\n    checkpoint:\n      path: draft\n"
    )
    assert build_main(["--config", str(good), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["role"] for r in rows] == ["target", "drafter.model"]
    assert all(r["arch"] == "llama" and r["vocab"] == 320 for r in rows)
    bad = write_config(
        checkpoints, "drafter:\n  kind: model\n  model:\n    checkpoint:\n      path: other_vocab\n"
    )
    assert build_main(["--config", str(bad)]) == 2
    assert "drafter.model.checkpoint" in capsys.readouterr().err
