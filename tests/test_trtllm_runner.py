"""The TensorRT-LLM runner over the contract stand-in of the executor bindings (``trtllm_standin``):
no empty draft is ever sent, too many drafts fail that request only, sampled requests send the
draft's logits, a hung executor is cancelled, tensor parallelism runs in orchestrator mode, and
speculative decoding over the stand-in's engines equals the torch engine. The runner contract suite
(``test_runner_contract.py``) runs over the stand-in too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from tiny import TINY_VOCAB, byte_tokenizer, reference_greedy, tokens_of
from trispec.config import load_config
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest
from trispec.sequence import FinishReason
from trtllm_files import drain, engine_over, stand_in_runner, trtllm_yaml, write_hf
from trtllm_standin_engine import write_engine

# -- 5. the runner over the stand-in -------------------------------------------------------------------


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
    [
        ("return_log_probs", True),
        ("repetition_penalty", 1.2),
        ("bad_words", ["ab"]),
        ("min_tokens", 3),
        ("logit_bias", {3: 1.0}),
        ("prediction", "abc"),
    ],
)
def test_logits_rules_are_refused_not_ignored(
    tmp_path: Path, trtllm_bindings, field: str, value: object
) -> None:  # type: ignore[no-untyped-def]
    llm = engine_over(stand_in_runner(tmp_path, ngram=True))
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(prompt="abc", max_tokens=4, **{field: value}))  # type: ignore[arg-type]
    assert info.value.field == field and "trtllm" in info.value.message
