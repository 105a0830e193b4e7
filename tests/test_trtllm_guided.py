"""Guided decoding on ``engine.kind: trtllm``, over the stand-in executor (trtllm_standin_guided): the
grammar goes to TensorRT-LLM as its source says (the guided-decoding config at executor creation,
per-request params), guided sequences decode without drafts (the 1.2.x runtime cannot check them), and
a guided request asking for drafts is refused saying so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tokenizers
from tiny import TINY_VOCAB, byte_tokenizer, run_to_completion, spec_engine, tiny_engine
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.errors import InvalidInputError
from trispec.guided import Guide
from trispec.guided.compiler import GrammarCompiler
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.trtllm_setup import guided_vocab
from trispec.scheduler import Scheduler
from trispec.tokenizer import Tokenizer
from trtllm_files import drain, stand_in_runner

GUIDE = Guide("regex", r"(yes|no)-[0-9]{2}")


def _tokenizer() -> Tokenizer:
    """The byte tokenizer with an end token (id 256): the runtime's grammar needs stop ids."""
    backend = tokenizers.Tokenizer.from_str(byte_tokenizer().backend.to_str())
    backend.add_special_tokens(["<eos>"])
    return Tokenizer(backend, eos_ids=frozenset([backend.token_to_id("<eos>")]))


def _engine(tmp: Path, tok: Tokenizer) -> LLMEngine:
    runner = stand_in_runner(tmp)
    # as trtllm_setup starts the target: with the guided-decoding config
    from trispec.runners.trtllm_executor import TrtllmExecutor

    runner.target = TrtllmExecutor(tmp / "t", kv_cache_tokens=4096, guided_vocab=guided_vocab(tok))
    runner.end_id = min(tok.eos_ids)  # as trtllm_setup makes the runner: the tokenizer's end token
    sched = Scheduler(
        runner,
        SchedulerConfig(adaptive_speculation=False, default_num_draft_tokens=4),
        encode=tok.encode,
        make_text_tracker=lambda stop: StopTextTracker(tok, stop),
        eos_ids=tok.eos_ids,
        grammars=GrammarCompiler(tok.backend, tok.eos_ids, TINY_VOCAB),
    )
    return LLMEngine(sched, runner)


def test_guided_requests_reach_the_runtime_and_decode_without_drafts(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    tok = _tokenizer()
    llm = _engine(tmp_path, tok)
    guided = llm.add_request(GenerationRequest(prompt="answer:", max_tokens=12, guide=GUIDE))
    plain = llm.add_request(GenerationRequest(prompt="answer:", max_tokens=6))
    outs = drain(llm)
    text = "".join(o.new_text for o in outs[guided])
    assert re.fullmatch(GUIDE.text, text), text
    config = llm.runner.target.executor.config.guided_decoding_config
    assert config.backend is trtllm_bindings.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR
    assert len(config.encoded_vocab) == 257 and config.stop_token_ids == [256]
    sent = [r for r in trtllm_bindings.Executor.enqueued if r.guided_decoding_params is not None]
    assert len(sent) == 1  # one request for the whole answer, masked at every step by the runtime
    assert sent[0].guided_decoding_params.guide_type is trtllm_bindings.GuidedDecodingParams.GuideType.REGEX
    assert sent[0].external_draft_tokens_config is None and sent[0].max_tokens == 12
    assert outs[plain][-1].stats.draft_tokens > 0  # the unguided request beside it still drafts
    # the same greedy text as our own runner's guided decoding over the same tiny model
    ours = spec_engine(tiny_engine(0), None, tokenizer=tok)
    rid = ours.add_request(
        GenerationRequest(prompt="answer:", max_tokens=12, num_draft_tokens=0, guide=GUIDE)
    )
    assert "".join(o.new_text for o in run_to_completion(ours)[rid]) == text


def test_a_guided_request_asking_for_drafts_is_refused_saying_why(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    llm = _engine(tmp_path, _tokenizer())
    with pytest.raises(InvalidInputError) as refused:
        llm.add_request(GenerationRequest(prompt="x", num_draft_tokens=4, guide=GUIDE))
    assert refused.value.field == "num_draft_tokens"
    assert "masks only the first row of a verify pass" in refused.value.message


def test_a_structural_tag_is_refused_before_it_reaches_the_runtime(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    """TensorRT-LLM's C++ runtime refuses kSTRUCTURAL_TAG (batch_manager/xgrammarFactory.cpp): say so."""
    llm = _engine(tmp_path, _tokenizer())
    tag = '{"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<f>"]}'
    with pytest.raises(InvalidInputError) as refused:
        llm.add_request(GenerationRequest(prompt="x", num_draft_tokens=0, guide=Guide("structural_tag", tag)))
    assert refused.value.field == "guided_decoding_guide_type" and "kSTRUCTURAL_TAG" in refused.value.message
    assert not llm.has_work() and not trtllm_bindings.Executor.enqueued


@pytest.mark.parametrize("end", ["\n", None], ids=["newline", "none"])
def test_the_runtime_ends_where_the_grammar_may_end_not_on_an_end_id_it_needs_as_text(
    tmp_path: Path, trtllm_bindings, end: str | None
) -> None:  # type: ignore[no-untyped-def]
    """TensorRT-LLM's decoder stops on the request's end id wherever it comes; its xgrammar allows
    the tokenizer's end token where the grammar may end. A guided request therefore carries the
    tokenizer's end token: a newline end id the regex needs is text, and the answer is complete (a
    request without end id included), as on the torch runner."""
    tok = _tokenizer()
    guide = Guide("regex", r"(yes|no)\n[0-9]{2}")
    end_id = tok.encode(end, add_bos=False)[0] if end is not None else -1
    llm = _engine(tmp_path, tok)
    rid = llm.add_request(GenerationRequest(prompt="answer:", max_tokens=12, guide=guide, end_id=end_id))
    outs = drain(llm)
    text = "".join(o.new_text for o in outs[rid])
    assert re.fullmatch(guide.text, text) and outs[rid][-1].finish_reason.value == "stop", text
    (sent,) = [r for r in trtllm_bindings.Executor.enqueued if r.guided_decoding_params is not None]
    assert sent.end_id == 256  # the grammar's stop token (GuidedDecodingConfig.stop_token_ids)
    ours = spec_engine(tiny_engine(0), None, tokenizer=tok)
    request = GenerationRequest(
        prompt="answer:", max_tokens=12, num_draft_tokens=0, guide=guide, end_id=end_id
    )
    rid = ours.add_request(request)
    assert "".join(o.new_text for o in run_to_completion(ours)[rid]) == text
