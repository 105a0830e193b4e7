"""TensorRT-LLM engines, checked without TensorRT-LLM: the cross-checks of a target/draft pair on
documented config.json fixtures (each mismatch its own error naming the key; older schemas;
``specdec-build --check-engines``) and the one KV budget split between the two engines.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from trispec.runners.kv_budget import split_kv_budget
from trispec.runners.trtllm_engines import check_pair, max_context, spec_mode_name
from trtllm_files import BIN, engines


# -- 3. engine cross-checks -----------------------------------------------------------------------------
def test_a_matching_pair_passes(tmp_path: Path) -> None:
    draft, target = engines(tmp_path)
    assert check_pair(draft, target, 4) == []
    assert check_pair(None, target, 8) == []
    # every round re-sends the sequence with its 4 drafts: 900 - 4 tokens of it, then the next token
    assert max_context(draft, target, 4) == 897
    assert max_context(None, target, 8) == 893


MISMATCHES = [
    # (which engine, dotted key in config.json, bad value, key the error must name)
    ("draft", "pretrained_config.vocab_size", 400, "pretrained_config.vocab_size"),
    ("target", "build_config.speculative_decoding_mode", 1, "build_config.speculative_decoding_mode"),
    ("target", "build_config.speculative_decoding_mode", "NONE", "build_config.speculative_decoding_mode"),
    ("draft", "build_config.speculative_decoding_mode", 2, "build_config.speculative_decoding_mode"),
    ("target", "build_config.max_draft_len", 3, "build_config.max_draft_len"),
    ("target", "build_config.max_draft_len", 0, "build_config.max_draft_len"),
    ("draft", "build_config.plugin_config.use_paged_context_fmha", False, "use_paged_context_fmha"),
    ("target", "build_config.plugin_config.use_paged_context_fmha", False, "use_paged_context_fmha"),
    ("target", "build_config.kv_cache_type", "CONTINUOUS", "build_config.kv_cache_type"),
    ("draft", "build_config.plugin_config.remove_input_padding", False, "remove_input_padding"),
    ("draft", "build_config.max_seq_len", 950, "build_config.max_seq_len"),
    ("draft", "build_config.max_input_len", 100, "build_config.max_input_len"),
    ("draft", "build_config.max_batch_size", 4, "build_config.max_batch_size"),
    ("draft", "build_config.max_input_len", 1200, "build_config.max_input_len"),
]


@pytest.mark.parametrize(("which", "key", "value", "named"), MISMATCHES)
def test_each_mismatch_gives_its_own_error_naming_the_key(
    tmp_path: Path, which: str, key: str, value: object, named: str
) -> None:
    draft, target = engines(tmp_path, **{which: {key: value}})
    problems = check_pair(draft, target, 4)
    assert len(problems) == 1, problems
    assert named in problems[0]
    assert which in problems[0]  # the values are given per engine


@pytest.mark.parametrize(
    "mode",
    [
        2,
        "DRAFT_TOKENS_EXTERNAL",
        "draft_tokens_external",
        "SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL",
        "2",
    ],
)
def test_spec_mode_as_integer_or_name(tmp_path: Path, mode: object) -> None:
    assert spec_mode_name(mode) == "DRAFT_TOKENS_EXTERNAL"
    draft, target = engines(tmp_path, target={"build_config.speculative_decoding_mode": mode})
    assert check_pair(draft, target, 4) == []


def test_older_schema_with_paged_kv_in_the_plugin_config(tmp_path: Path) -> None:
    draft, target = engines(tmp_path, target={"build_config.kv_cache_type": None})
    assert check_pair(draft, target, 4) == []  # plugin_config.paged_kv_cache: true


def test_check_engines_command(tmp_path: Path) -> None:
    engines(tmp_path)
    cmd = [str(BIN / "specdec-build"), "check-engines", "--draft", str(tmp_path / "draft"), "--target"]
    ok = subprocess.run(
        [*cmd, str(tmp_path / "target"), "--num-draft-tokens", "4"], capture_output=True, text=True
    )
    assert ok.returncode == 0 and len(ok.stdout.splitlines()) == 1 and "engines fit" in ok.stdout
    assert "max context 897 tokens (target build_config.max_input_len 900 - 4 drafts)" in ok.stdout
    assert "max_num_tokens 8192 per step" in ok.stdout
    too_many = subprocess.run(
        [*cmd, str(tmp_path / "target"), "--num-draft-tokens", "9"], capture_output=True, text=True
    )
    assert too_many.returncode == 1 and too_many.stdout.splitlines() == [
        line for line in too_many.stdout.splitlines() if "max_draft_len" in line
    ]
    engines(
        tmp_path / "bad", draft={"pretrained_config.vocab_size": 1}, target={"build_config.max_draft_len": 2}
    )
    bad = subprocess.run(
        [*cmd[:-3], "--draft", str(tmp_path / "bad/draft"), "--target", str(tmp_path / "bad/target"),
         "--num-draft-tokens", "4"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 1 and len(bad.stdout.splitlines()) == 2
    missing = subprocess.run(
        [*cmd, str(tmp_path / "nowhere"), "--num-draft-tokens", "4"], capture_output=True, text=True
    )
    assert (
        missing.returncode == 2 and "no config.json" in missing.stderr and "Traceback" not in missing.stderr
    )


# -- 4. one KV budget ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("budget_gib", "target_bpt", "draft_bpt", "block"),
    [
        (8, 28 * 2 * 128 * 2 * 2, 24 * 2 * 64 * 2 * 2, 32),  # Qwen2.5 1.5B + 0.5B, bf16
        (0.5, 30 * 3 * 64 * 2 * 2, 30 * 3 * 64 * 2 * 1, 64),  # SmolLM2, int8 KV draft
        (3.3, 1000, 0, 16),  # a model-free drafter: the target takes it all
    ],
)
def test_kv_split_equal_tokens_and_bytes_sum_to_the_budget(
    budget_gib: float, target_bpt: int, draft_bpt: int, block: int
) -> None:
    budget = budget_gib * 2**30
    split = split_kv_budget(budget, target_bpt, draft_bpt, block)
    assert split.tokens % block == 0
    # both hold split.tokens tokens: equal capacity
    assert split.target_bytes == split.tokens * target_bpt and split.draft_bytes == split.tokens * draft_bpt
    spent = split.target_bytes + split.draft_bytes
    assert budget - block * (target_bpt + draft_bpt) < spent <= budget  # within one block of each
    assert "tokens in each executor" in split.describe()


def test_kv_bytes_per_token_from_the_engine(tmp_path: Path) -> None:
    draft, target = engines(
        tmp_path,
        target={
            "pretrained_config.mapping.tp_size": 2,
            "pretrained_config.quantization.kv_cache_quant_algo": "FP8",
        },
    )
    assert draft.kv_bytes_per_token() == 2 * 2 * 16 * 2 * 2  # layers x KV heads x head x K,V x bf16
    assert target.kv_bytes_per_token() == 2 * 1 * 16 * 2 * 1  # heads split over 2 ranks, fp8 KV


def test_kv_budget_too_small_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="holds no block"):
        split_kv_budget(1000, 4096, 4096, 32)
