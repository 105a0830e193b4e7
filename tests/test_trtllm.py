"""TensorRT-LLM, checked without TensorRT-LLM: engine cross-checks on documented config.json fixtures,
the KV-budget split, the build commands flag by flag, and the runner's behaviour over the contract
stand-in of the executor bindings (``trtllm_standin``). The runner contract suite
(``test_runner_contract.py``) runs over the stand-in too."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from tiny import TINY_VOCAB, ascii_tokenizer, byte_tokenizer, reference_greedy, tiny_args, tokens_of
from trispec.config import load_config
from trispec.engine.random_weights import random_state_dict
from trispec.errors import ConfigError, InvalidInputError
from trispec.request import GenerationRequest
from trispec.runners.kv_budget import split_kv_budget
from trispec.runners.trtllm_engines import check_pair, max_context, read_engine, spec_mode_name
from trispec.sequence import FinishReason
from trtllm_standin import engine_config, write_engine

BIN = Path(sys.executable).parent


def engines(tmp: Path, draft: dict | None = None, target: dict | None = None, k: int = 4):
    d = tmp / "draft"
    t = tmp / "target"
    for path, overrides, mode, draft_len in ((d, dict(draft or {}), 1, 0), (t, dict(target or {}), 2, 8)):
        # as trtllm-build would write them from one --max_seq_len (see engine_config)
        mode = overrides.pop("build_config.speculative_decoding_mode", mode)
        draft_len = overrides.pop("build_config.max_draft_len", draft_len)
        config = engine_config(spec_mode=mode, max_draft_len=draft_len)
        for dotted, value in overrides.items():
            node = config
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node[key]
            node[leaf] = value
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
    return read_engine(d), read_engine(t)


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


# -- 2. the build, dry run -----------------------------------------------------------------------------
def write_hf(folder: Path, arch: str, seed: int) -> Path:
    """A tiny HF checkpoint (safetensors, config.json, tokenizer.json)."""
    args = tiny_args(arch)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(random_state_dict(args, seed), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(args.to_hf_config()))
    ascii_tokenizer().backend.save(str(folder / "tokenizer.json"))
    return folder


def trtllm_yaml(tmp: Path, drafter: str, trtllm: str = "", scheduler: str = "") -> Path:
    path = tmp / "pair.yaml"
    path.write_text(
        "engine: {kind: trtllm}\ntarget: {checkpoint: {path: target}}\n"
        f"drafter: {drafter}\n"
        f"trtllm: {{engines_dir: out, kv_cache: {{gib: 1}}{trtllm}}}\n"
        f"scheduler: {{max_num_draft_tokens: 4, default_num_draft_tokens: 4{scheduler}}}\n"
    )
    return path


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


# -- 5. the runner over the stand-in -------------------------------------------------------------------
def stand_in_runner(tmp: Path, *, target_draft_len: int = 8, ngram: bool = False, num_draft_tokens: int = 8):
    from trispec.drafters.ngram import NgramDrafter
    from trispec.runners.trtllm_executor import TrtllmExecutor
    from trispec.runners.trtllm_runner import TrtllmSpecRunner

    t = write_engine(tmp / "t", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=target_draft_len)
    d = write_engine(tmp / "d", vocab_size=TINY_VOCAB, seed=7)
    target = TrtllmExecutor(t, kv_cache_tokens=4096)
    if ngram:
        return TrtllmSpecRunner(
            target, read_engine(t), drafter=NgramDrafter(TINY_VOCAB), kv_tokens=4096, num_draft_tokens=8
        )
    draft = TrtllmExecutor(d, kv_cache_tokens=4096, gather_generation_logits=True)
    return TrtllmSpecRunner(
        target,
        read_engine(t),
        draft=draft,
        draft_info=read_engine(d),
        kv_tokens=4096,
        num_draft_tokens=num_draft_tokens,
    )


def engine_over(runner):  # type: ignore[no-untyped-def]
    from trispec.config import SchedulerConfig
    from trispec.detokenize import StopTextTracker
    from trispec.llm_engine import LLMEngine
    from trispec.scheduler import Scheduler

    tok = byte_tokenizer()
    sched = Scheduler(
        runner,
        SchedulerConfig(adaptive_speculation=False),
        encode=tok.encode,
        make_text_tracker=lambda stop: StopTextTracker(tok, stop),
        eos_ids=frozenset(),
    )
    return LLMEngine(sched, runner)


def test_no_empty_draft_is_ever_sent(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    llm = engine_over(stand_in_runner(tmp_path, ngram=True))
    for prompt in ("abababababab", "xyz", "hello hello hello"):  # n-gram finds drafts for some only
        llm.add_request(GenerationRequest(prompt=prompt, max_tokens=12, num_draft_tokens=4))
    drain(llm)
    sent = trtllm_bindings.Executor.enqueued
    with_draft = [r for r in sent if r.external_draft_tokens_config is not None]
    plain = [r for r in sent if r.external_draft_tokens_config is None]
    assert with_draft and plain
    assert all(r.external_draft_tokens_config.tokens for r in with_draft)
    assert all(r.max_tokens == len(r.external_draft_tokens_config.tokens) + 1 for r in with_draft)
    assert all(r.max_tokens == 1 for r in plain)
    assert all(r.output_config.exclude_input_from_output for r in sent)


def drain(llm) -> dict:  # type: ignore[no-untyped-def]
    outputs: dict[int, list] = {}
    while llm.has_work():
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


def test_too_many_drafts_fail_that_request_and_the_runner_never_sends_them(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    # what TensorRT-LLM does with a draft longer than max_draft_len: LlmRequest::validate throws when
    # the executor fetches the request, and fetchNewRequests fails that request alone
    engine = write_engine(tmp_path / "e", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=2)
    ex = trtllm_bindings.Executor(
        engine, trtllm_bindings.ModelType.DECODER_ONLY, trtllm_bindings.ExecutorConfig()
    )
    fine = ex.enqueue_request(trtllm_bindings.Request([1, 2, 3], 1))
    bad = ex.enqueue_request(
        trtllm_bindings.Request(
            [1, 2, 3], 5, external_draft_tokens_config=trtllm_bindings.ExternalDraftTokensConfig([4, 5, 6, 7])
        )
    )
    (fine_response,), (bad_response,) = ex.await_responses([fine, bad])
    assert not fine_response.has_error() and len(fine_response.result.output_token_ids[0]) == 4
    assert bad_response.has_error()
    assert "Draft tokens length (4) exceeds maximum draft tokens length (2)" in bad_response.error_msg
    with pytest.raises(RuntimeError, match=r"mTokens\.empty"):
        trtllm_bindings.ExternalDraftTokensConfig([])
    # so the runner cuts drafts to the engine's max_draft_len: k = 4 on a max_draft_len 2 engine
    llm = engine_over(stand_in_runner(tmp_path, target_draft_len=2))
    wide = llm.add_request(GenerationRequest(prompt="abc", max_tokens=8, num_draft_tokens=4))
    narrow = llm.add_request(GenerationRequest(prompt="abcd", max_tokens=8, num_draft_tokens=2))
    outputs = drain(llm)
    assert all(outputs[r][-1].finish_reason is FinishReason.LENGTH for r in (wide, narrow))
    drafts = [r.external_draft_tokens_config.tokens for r in trtllm_bindings.Executor.enqueued[2:]
              if r.external_draft_tokens_config is not None]  # fmt: skip
    assert drafts and max(map(len, drafts)) == 2
    assert tokens_of(outputs[wide]) == reference_greedy(byte_tokenizer().encode("abc"), 8)


def test_sampled_requests_send_the_draft_logits(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    llm = engine_over(stand_in_runner(tmp_path, num_draft_tokens=4))
    rid = llm.add_request(
        GenerationRequest(prompt="hello", max_tokens=10, num_draft_tokens=3, temperature=0.9, seed=4)
    )
    outputs = drain(llm)
    assert outputs[rid][-1].finish_reason is FinishReason.LENGTH
    sent = trtllm_bindings.Executor.enqueued
    drafts = [r for r in sent if r.output_config.return_generation_logits]
    verifies = [r for r in sent if r.external_draft_tokens_config is not None]
    assert drafts and verifies
    for r in verifies:
        logits = r.external_draft_tokens_config.logits
        assert isinstance(logits, torch.Tensor) and logits.dtype == torch.float32
        assert list(logits.shape) == [len(r.external_draft_tokens_config.tokens), TINY_VOCAB]
    # and the seeded request reproduces
    llm2 = engine_over(stand_in_runner(tmp_path / "again", num_draft_tokens=4))
    rid2 = llm2.add_request(
        GenerationRequest(prompt="hello", max_tokens=10, num_draft_tokens=3, temperature=0.9, seed=4)
    )
    assert tokens_of(drain(llm2)[rid2]) == tokens_of(outputs[rid])


def test_sampled_requests_without_draft_logits_send_tokens_only(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    from trispec.runners.trtllm_runner import TrtllmSpecRunner

    runner = stand_in_runner(tmp_path, num_draft_tokens=4)
    assert isinstance(runner, TrtllmSpecRunner)
    runner.draft_logits = False
    llm = engine_over(runner)
    llm.add_request(
        GenerationRequest(prompt="hello", max_tokens=10, num_draft_tokens=3, temperature=0.9, seed=4)
    )
    drain(llm)
    sent = trtllm_bindings.Executor.enqueued
    assert not any(r.output_config.return_generation_logits for r in sent)
    assert all(r.external_draft_tokens_config.logits is None for r in sent if r.external_draft_tokens_config)


def test_a_hung_executor_is_cancelled_and_fails_the_round(
    tmp_path: Path, trtllm_bindings, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import trispec.runners.trtllm_runner as runner_module

    monkeypatch.setattr(runner_module, "ROUND_TIMEOUT_S", 0.2)
    runner = stand_in_runner(tmp_path, ngram=True)
    llm = engine_over(runner)
    trtllm_bindings.Executor.stalled = True
    rid = llm.add_request(GenerationRequest(prompt="abc", max_tokens=4))
    outputs = drain(llm)
    assert outputs[rid][-1].finish_reason is FinishReason.ERROR and "cancelled" in outputs[rid][-1].error
    assert runner.target.executor.cancelled  # cancel_request was called for the hung request


def test_tensor_parallel_runs_in_orchestrator_mode(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    """tp_size 2 from one process: every executor gets both GPUs, orchestrator mode and the worker."""
    from trispec.runners.trtllm_executor import TrtllmExecutor

    tp2 = {"pretrained_config__mapping__tp_size": 2}
    t = write_engine(tmp_path / "t", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8, **tp2)
    worker = Path("/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker")
    executor = TrtllmExecutor(t, kv_cache_tokens=1024, device_ids=[2, 3], worker_executable=worker)
    parallel = executor.executor.config.parallel_config
    assert parallel.device_ids == [2, 3]
    assert parallel.communication_mode is trtllm_bindings.CommunicationMode.ORCHESTRATOR
    assert parallel.orchestrator_config.worker_executable_path == str(worker)
    one = write_engine(tmp_path / "one", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    single = TrtllmExecutor(one, kv_cache_tokens=1024, device_ids=[1], worker_executable=worker)
    leader = trtllm_bindings.CommunicationMode.LEADER
    assert single.executor.config.parallel_config.communication_mode is leader


def test_engine_kind_trtllm_without_the_package_names_it(tmp_path: Path) -> None:
    from trispec.llm import SpeculativeLLM
    from trispec.runners.trtllm_executor import TrtllmUnavailable

    write_hf(tmp_path / "target", "llama", 0)
    write_engine(tmp_path / "out/engines/target", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    config = load_config(trtllm_yaml(tmp_path, "{kind: ngram}"))
    assert "tensorrt_llm" not in sys.modules
    with pytest.raises(TrtllmUnavailable, match=r"tensorrt_llm 1\.2\.x"):
        SpeculativeLLM.from_config(config)


def test_speculative_llm_over_trtllm_engines_equals_the_torch_engine(
    tmp_path: Path, trtllm_bindings, capsys
) -> None:  # type: ignore[no-untyped-def]
    """The whole stack from YAML with engine.kind trtllm (stand-in executors running the same tiny
    weights) gives the torch engine's greedy text; the KV split is printed at start-up."""
    from trispec.llm import SpeculativeLLM

    write_hf(tmp_path / "target", "llama", 0)  # random_state_dict(seed 0): the stand-in's weights
    write_engine(tmp_path / "out/engines/target", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    write_engine(tmp_path / "out/engines/draft", vocab_size=TINY_VOCAB, seed=7)
    (tmp_path / "draft").mkdir()
    write_hf(tmp_path / "draft", "llama", 7)
    # adaptive speculation off: it chooses by measured time, and this test wants every request to draft
    trt = load_config(
        trtllm_yaml(
            tmp_path,
            "{kind: model, model: {checkpoint: {path: draft}}}",
            scheduler=", adaptive_speculation: false",
        )
    )
    torch_config = trt.model_copy(update={"engine": trt.engine.model_copy(update={"kind": "torch"})})
    prompts = ["hello there", "abcabcabc", "the rain"]
    via_trt = SpeculativeLLM.from_config(trt)
    assert "KV cache:" in capsys.readouterr().out
    via_torch = SpeculativeLLM.from_config(torch_config)
    got = via_trt.generate([via_trt.request(p, max_tokens=16, num_draft_tokens=4) for p in prompts])
    want = via_torch.generate([via_torch.request(p, max_tokens=16, num_draft_tokens=0) for p in prompts])
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert all(r.stats.draft_tokens > 0 for r in got)


@pytest.mark.parametrize(
    ("field", "value"),
    [("return_log_probs", True), ("repetition_penalty", 1.2), ("bad_words", ["ab"]), ("min_tokens", 3)],
)
def test_logits_rules_are_refused_not_ignored(
    tmp_path: Path, trtllm_bindings, field: str, value: object
) -> None:  # type: ignore[no-untyped-def]
    llm = engine_over(stand_in_runner(tmp_path, ngram=True))
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(prompt="abc", max_tokens=4, **{field: value}))  # type: ignore[arg-type]
    assert info.value.field == field and "trtllm" in info.value.message
