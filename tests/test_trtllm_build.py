"""The TensorRT-LLM engine build, dry run (TensorRT-LLM cannot be installed here): both checkpoint
conversions and both builds flag by flag, the self-draft as the target's int8 weight-only copy, an
n-gram drafter building only the target, one clear line without TensorRT-LLM, config checks that
name the key.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from trispec.config import load_config
from trispec.errors import ConfigError
from trtllm_files import BIN, trtllm_yaml, write_hf


def flags(command: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(command):
        if command[i].startswith("--"):
            has_value = i + 1 < len(command) and not command[i + 1].startswith("--")
            out[command[i]] = command[i + 1] if has_value else None
            i += 2 if has_value else 1
        else:
            i += 1
    return out


def test_dry_run_prints_both_conversions_and_builds_flag_by_flag(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "qwen2", 0)
    write_hf(tmp_path / "draft", "llama", 1)
    config = trtllm_yaml(
        tmp_path,
        "{kind: model, model: {checkpoint: {path: draft}}}",
        ", dtype: float16, tp_size: 2, gpu_ids: [0, 1], max_batch_size: 6, max_input_len: 1000, "
        "max_seq_len: 1500, max_draft_len: 5, weight_only: int4, examples_dir: /opt/ex, draft_logits: true",
    )
    run = subprocess.run(
        [str(BIN / "specdec-build"), "--config", str(config), "--dry-run"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    commands = [shlex.split(line) for line in run.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 4
    plan = json.loads((tmp_path / "out/build_plan.json").read_text())["steps"]
    assert [s["command"] for s in plan] == commands
    convert_t, build_t, convert_d, build_d = commands
    out = tmp_path / "out"
    assert convert_t[1] == "/opt/ex/models/core/qwen/convert_checkpoint.py"
    assert convert_d[1] == "/opt/ex/models/core/llama/convert_checkpoint.py"
    for convert, role in ((convert_t, "target"), (convert_d, "draft")):
        f = flags(convert)
        assert f["--model_dir"] == str(out / "hf" / role) and f["--output_dir"] == str(
            out / "checkpoints" / role
        )
        assert f["--dtype"] == "float16" and f["--tp_size"] == "2"
        assert "--use_weight_only" in f and f["--weight_only_precision"] == "int4"
    for build, role in ((build_t, "target"), (build_d, "draft")):
        assert build[0] == "trtllm-build"
        f = flags(build)
        assert f["--checkpoint_dir"] == str(out / "checkpoints" / role)
        assert f["--output_dir"] == str(out / "engines" / role)
        assert f["--gemm_plugin"] == "float16"
        assert f["--kv_cache_type"] == "paged"
        assert f["--use_paged_context_fmha"] == "enable"
        assert f["--remove_input_padding"] == "enable"
        assert (f["--max_batch_size"], f["--max_input_len"], f["--max_seq_len"]) == ("6", "1000", "1500")
        assert f["--max_num_tokens"] == "8192"  # explicit: trtllm-build would raise it for the target
    target_flags, draft_flags = flags(build_t), flags(build_d)
    assert target_flags["--speculative_decoding_mode"] == "draft_tokens_external"
    assert target_flags["--max_draft_len"] == "5"
    assert "--speculative_decoding_mode" not in draft_flags and "--max_draft_len" not in draft_flags
    assert "--gather_generation_logits" in draft_flags  # draft logits verify sampled requests
    llmapi = (out / "llmapi/extra_llm_api_options.yaml").read_text()
    assert "decoding_type: DraftTarget" in llmapi and str(out / "hf/draft") in llmapi
    model = yaml.safe_load((out / "llmapi/model.yaml").read_text())
    # what Triton's llmapi model reads itself (it fails to load without it), and LLM() arguments
    assert model["triton_config"] == {"max_batch_size": 6, "decoupled": True}
    assert model["speculative_config"]["max_concurrency"] == 8 and model["backend"] == "pytorch"
    assert "triton_config" not in yaml.safe_load((out / "llmapi/extra_llm_api_options.yaml").read_text())


def test_self_draft_is_the_target_int8_weight_only(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "llama", 0)
    config = trtllm_yaml(tmp_path, "{kind: self, precision: int8}")
    run = subprocess.run(
        [str(BIN / "specdec-build"), "--config", str(config), "--dry-run"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    convert_t, _, convert_d, _ = [
        shlex.split(line) for line in run.stdout.splitlines() if not line.startswith("#")
    ]
    assert flags(convert_d)["--model_dir"] == flags(convert_t)["--model_dir"]
    assert flags(convert_d)["--weight_only_precision"] == "int8" and "--use_weight_only" not in flags(
        convert_t
    )


def test_ngram_drafter_builds_only_the_target(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "llama", 0)
    run = subprocess.run(
        [str(BIN / "specdec-build"), "--config", str(trtllm_yaml(tmp_path, "{kind: ngram}")), "--dry-run"],
        capture_output=True, text=True,
    )  # fmt: skip
    commands = [line for line in run.stdout.splitlines() if not line.startswith("#")]
    assert run.returncode == 0 and len(commands) == 2 and "draft_tokens_external" in commands[1]


def test_without_tensorrt_llm_the_build_stops_with_one_line(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "llama", 0)
    run = subprocess.run(
        [str(BIN / "specdec-build"), "--config", str(trtllm_yaml(tmp_path, "{kind: ngram}"))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stdout == "" and len(run.stderr.strip().splitlines()) == 1
    assert "tensorrt_llm 1.2.x" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "out/hf").exists()  # nothing exported before the check


def test_trtllm_config_checks_name_the_key(tmp_path: Path) -> None:
    write_hf(tmp_path / "target", "llama", 0)
    with pytest.raises(ConfigError) as info:
        load_config(trtllm_yaml(tmp_path, "{kind: ngram}", ", max_draft_len: 2"))
    assert info.value.field == "scheduler.max_num_draft_tokens"
    with pytest.raises(ConfigError) as info:
        load_config(trtllm_yaml(tmp_path, "{kind: self, precision: bfloat16}"))
    assert info.value.field == "drafter.precision"
