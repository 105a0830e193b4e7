"""Prompt log-probs (OpenAI's ``echo`` with ``logprobs``): every prompt token after the first scored
under the target's own softmax, the same whatever the chunking of the prefill, k or the prefix cache."""

from __future__ import annotations

import pytest
import torch
from tiny import model_drafter, run_to_completion, spec_engine, tiny_engine
from trispec.engine.base import ForwardInput
from trispec.logits_rules import top_log_probs_of
from trispec.request import GenerationRequest
from trispec.sampling_params import SamplingParams
from trispec.scheduler import RequestOutput
from trispec.sequence import Sequence
from trispec.step import PromptLogProbs

# long enough for several prefill chunks of 16 and a few full KV blocks of 8
PROMPT = [(7 * i + 3) % 250 + 1 for i in range(53)]


def scores(llm, **fields: object) -> tuple[PromptLogProbs, list[RequestOutput]]:  # type: ignore[no-untyped-def]
    request = GenerationRequest(prompt_token_ids=PROMPT, max_tokens=5, prompt_log_probs=True, **fields)  # type: ignore[arg-type]
    rid = llm.add_request(request)
    outputs = run_to_completion(llm)[rid]
    carried = [o.prompt_log_probs for o in outputs if o.prompt_log_probs is not None]
    assert len(carried) == 1 and outputs[0].prompt_log_probs is not None  # on the first output only
    return carried[0], outputs


def test_prompt_log_probs_are_the_targets_softmax_whatever_the_chunks_or_k() -> None:
    target = tiny_engine(0)
    target.add_sequence(0, len(PROMPT))
    logits = target.forward([ForwardInput(0, PROMPT, len(PROMPT))])[0][:-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(PROMPT[1:]).view(-1, 1)).view(-1)
    top = top_log_probs_of(logits, SamplingParams(return_log_probs=True, top_log_probs=3), len(PROMPT) - 1)
    runs = []
    for k, chunk in ((0, 512), (3, 16), (4, 7)):
        llm = spec_engine(
            tiny_engine(0), model_drafter(5), max_context=256, max_prefill_tokens_per_step=chunk
        )
        got, _ = scores(
            llm, num_draft_tokens=k, return_log_probs=True, top_log_probs=3, temperature=0.8, seed=2
        )
        assert got.first == 1 and got.log_probs == pytest.approx(expected.tolist(), abs=1e-4)
        assert got.top is not None and [a.token_ids for a in got.top] == [a.token_ids for a in top]
        runs.append(got)
    # bit for bit whatever the chunking and k: each row is the same row of the same batch-invariant pass
    assert runs[0] == runs[1] == runs[2]


def test_a_cached_prompt_is_computed_again_for_its_log_probs() -> None:
    llm = spec_engine(tiny_engine(0), None, max_context=256)
    plain = GenerationRequest(prompt_token_ids=PROMPT, max_tokens=5)
    rid = llm.add_request(plain)
    run_to_completion(llm)
    again = llm.add_request(plain)
    assert run_to_completion(llm)[again][-1].cached_tokens > 0  # the prompt's full blocks are cached
    got, outputs = scores(llm)
    assert outputs[-1].cached_tokens == 0 and len(got.log_probs) == len(PROMPT) - 1
    fresh, _ = scores(spec_engine(tiny_engine(0), None, max_context=256))
    assert got == fresh and rid != again


def test_a_prompt_scored_again_in_other_chunks_is_kept_once() -> None:
    """After a preemption the prompt is recomputed, maybe cut into other chunks: each token's score is
    kept once, in order, whatever overlaps what was kept."""
    seq = Sequence(0, PROMPT[:8], 4, 0, SamplingParams(prompt_log_probs=True), text=None)  # type: ignore[arg-type]
    seq.take_prompt_scores(PromptLogProbs(1, [-1.0, -2.0, -3.0]))  # tokens 1-3
    seq.take_prompt_scores(PromptLogProbs(1, [-1.0, -2.0]))  # recomputed: nothing new
    seq.take_prompt_scores(PromptLogProbs(3, [-3.0, -4.0, -5.0]))  # overlaps: 4 and 5 are new
    seq.take_prompt_scores(PromptLogProbs(7, [-7.0]))  # a gap: not kept
    seq.take_prompt_scores(PromptLogProbs(6, [-6.0, -7.0]))
    assert seq.prompt_log_probs == [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]


def test_admission_counts_no_cache_hits_for_a_request_that_computes_its_whole_prompt() -> None:
    """A request asking for prompt log-probs takes nothing from the prefix cache: it is admitted only
    when its whole prompt fits, not on the strength of blocks a running request holds (which would
    admit it needing one block, then preempt that request to fit its prefill)."""
    prompt = [(11 * i + 5) % 250 + 1 for i in range(160)]  # 20 blocks of 8
    llm = spec_engine(tiny_engine(0, num_blocks=30), None, max_context=240, max_prefill_tokens_per_step=64)
    running = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=30))
    for _ in range(4):
        llm.step()
    scoring = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=4, prompt_log_probs=True))
    started_beside = False
    while llm.has_work():
        llm.step()
        ids = {s.seq_id for s in llm.scheduler.running}
        started_beside |= {running, scoring} <= ids
    assert not started_beside and llm.stats.preemptions == 0
