"""The TensorRT-LLM runner against what the 1.2.x runtime really does (fact sheet §0, modelled in
``trtllm_standin`` from TensorRT-LLM's source): sampling that is really sampling and lossless with
draft logits, contexts longer than max_num_tokens, per-request ``validate()`` errors, the KV budget
with both engines' weights loaded, and what the runner sends for each request's sampling and end id.
End tokens over every runner are in ``test_runner_contract.py``; the whole stack from YAML through
``specdec-generate`` in ``test_trtllm_generate.py``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from tiny import TINY_VOCAB, reference_greedy, tiny_engine, tokens_of
from trispec.drafters.ngram import NgramDrafter
from trispec.engine.base import ForwardInput
from trispec.errors import InvalidInputError
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.trtllm_engines import read_engine
from trispec.runners.trtllm_executor import TrtllmExecutor
from trispec.runners.trtllm_runner import TrtllmSpecRunner
from trispec.runners.trtllm_sampling import TOP_K_MAX, sampling_config_kwargs
from trispec.sampling_params import SamplingParams
from trispec.sequence import FinishReason
from trtllm_files import drain, engine_over
from trtllm_standin_engine import write_engine


def runner_over(
    tmp: Path,
    *,
    draft_logits: bool = True,
    chunked_context: bool = True,
    engine: dict | None = None,
    draft_engine: dict | None = None,
    draft_info_engine: dict | None = None,
) -> TrtllmSpecRunner:
    """A draft engine (the target's tiny model with noise: it agrees often, not always) and a target
    engine (``tiny_engine(0)``'s model) over the stand-in executors; ``engine`` / ``draft_engine``
    override config.json keys; ``draft_info_engine`` makes the runner believe other draft limits."""
    t = write_engine(tmp / "t", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8, **(engine or {}))
    d = write_engine(tmp / "d", vocab_size=TINY_VOCAB, seed=0, noise=0.1, **(draft_engine or {}))
    info = d
    if draft_info_engine is not None:
        info = write_engine(tmp / "d-as-believed", vocab_size=TINY_VOCAB, seed=0, **draft_info_engine)
    executors = {"kv_cache_tokens": 8192, "enable_chunked_context": chunked_context}
    return TrtllmSpecRunner(
        TrtllmExecutor(t, **executors),
        read_engine(t),
        draft=TrtllmExecutor(d, gather_generation_logits=draft_logits, **executors),
        draft_info=read_engine(info),
        kv_tokens=8192,
        num_draft_tokens=8,
        draft_logits=draft_logits,
        chunked_context=chunked_context,
    )


# -- what one request becomes -----------------------------------------------------------------------
def test_sampling_settings_as_tensorrt_llm_reads_them() -> None:
    """Unset top_k / top_p are greedy in TensorRT-LLM whatever the temperature: a sampled request
    always sends top_p (1.0 when the request leaves it off), top_k only when set, clipped as the
    kernel clips it; greedy says so explicitly."""
    assert sampling_config_kwargs(SamplingParams(), seed=3) == {"top_k": 1}
    sampled = sampling_config_kwargs(SamplingParams(temperature=0.7), seed=3)
    assert sampled == {"temperature": 0.7, "top_p": 1.0, "seed": 3}
    nucleus = sampling_config_kwargs(SamplingParams(temperature=1.0, top_p=0.9, top_k=40), seed=5)
    assert nucleus == {"temperature": 1.0, "top_p": 0.9, "top_k": 40, "seed": 5}
    assert sampling_config_kwargs(SamplingParams(temperature=1.0, top_k=5000), seed=5)["top_k"] == TOP_K_MAX


# -- sampled requests: sampled, and lossless with draft logits ---------------------------------------
SAMPLES = 300
# the n-gram drafter proposes 126 after this prompt (it followed 89 169 before), a token the target
# gives p = 0.52 at T = 0.5: TensorRT-LLM's token-match rule would emit it with p (2 - p) = 0.77
NGRAM_PROMPT = [89, 169, 126, 89, 169]
MODEL_PROMPT = [104, 101, 108, 108, 111]


def first_tokens(llm: LLMEngine, prompt: list[int], **sampling: object) -> Counter[int]:
    """The first token of SAMPLES seeded requests (seeds 0..SAMPLES-1), each verifying one draft."""
    ids = [
        llm.add_request(
            GenerationRequest(prompt_token_ids=prompt, max_tokens=2, num_draft_tokens=1, seed=s, **sampling)
        )
        for s in range(SAMPLES)
    ]
    outputs = drain(llm)
    assert llm.stats.draft_tokens == SAMPLES
    return Counter(tokens_of(outputs[rid])[0] for rid in ids)


def target_distribution(
    prompt: list[int], temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The distribution the target samples the first token from: logits / T, the top_k most likely,
    then the smallest set of those reaching top_p of their mass (written out here, not ours reused)."""
    engine = tiny_engine(0)
    engine.add_sequence(0, len(prompt) + 1)
    logits = engine.forward([ForwardInput(0, prompt, 1)])[0][-1].double() / temperature
    order = torch.argsort(logits, descending=True)
    kept = order[:top_k] if top_k else order
    mass = torch.softmax(logits[kept], dim=0)
    kept = kept[(torch.cumsum(mass, dim=0) - mass) < top_p]
    probs = torch.zeros_like(logits)
    probs[kept] = torch.softmax(logits[kept], dim=0)
    return probs


def chi_square_p_value(counts: Counter[int], probs: torch.Tensor) -> float:
    """Pearson's test of ``counts`` against ``probs``; tokens expected fewer than 5 times pooled."""
    n = sum(counts.values())
    assert all(probs[t] > 0 for t in counts), "a token the target never samples came out"
    expected = probs * n
    big = [t for t in range(len(probs)) if expected[t] >= 5]
    observed = [counts.get(t, 0) for t in big] + [n - sum(counts.get(t, 0) for t in big)]
    wanted = [float(expected[t]) for t in big] + [n - float(sum(expected[t] for t in big))]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted) if e > 0)
    df = len(big)  # bins - 1, with the pooled bin
    return float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def ngram_runner(tmp: Path, *, draft_logits: bool) -> TrtllmSpecRunner:
    t = write_engine(tmp / "t", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    return TrtllmSpecRunner(
        TrtllmExecutor(t, kv_cache_tokens=8192),
        read_engine(t),
        drafter=NgramDrafter(TINY_VOCAB),
        kv_tokens=8192,
        num_draft_tokens=8,
        draft_logits=draft_logits,
    )


def test_sampled_requests_follow_the_targets_distribution_with_the_drafts_logits(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    """T 0.5, top-k 20, top-p 0.9, a draft model: its logits go with its tokens divided by T and
    masked to its top-k/top-p set, so TensorRT-LLM's p/q rule is the lossless one and the first token
    follows the target's distribution (a request without top_p would be decoded greedily)."""
    sampling = {"temperature": 0.5, "top_k": 20, "top_p": 0.9}
    counts = first_tokens(engine_over(runner_over(tmp_path)), MODEL_PROMPT, **sampling)
    probs = target_distribution(MODEL_PROMPT, **sampling)  # type: ignore[arg-type]
    assert len(counts) > 5 and counts[int(probs.argmax())] < SAMPLES * 0.9
    assert chi_square_p_value(counts, probs) > 1e-3
    sent = trtllm_bindings.Executor.enqueued
    verifies = [r for r in sent if r.external_draft_tokens_config is not None]
    assert len(verifies) == SAMPLES and all(
        r.external_draft_tokens_config.logits is not None for r in verifies
    )
    assert all((r.sampling_config.top_p, r.sampling_config.top_k) == (0.9, 20) for r in sent)


def test_draft_logits_are_the_drafts_sampling_distribution() -> None:
    """What goes to TensorRT-LLM, whose check takes a plain softmax of it, is the distribution the
    draft sampled from: logits / T, -inf outside top-k then top-p, padded vocabulary entries -inf."""
    from trispec.runners.trtllm_sampling import draft_logits_for_acceptance

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1)) * 3
    padded = torch.cat([logits, torch.zeros(3, 8)], dim=1)  # vocab 40 padded to 48
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.8)
    got = torch.softmax(draft_logits_for_acceptance(padded, params, vocab_size=40), dim=-1)
    for row in range(3):
        scaled = logits[row].double() / 0.7
        order = torch.argsort(scaled, descending=True)[:10]
        mass = torch.softmax(scaled[order], dim=0)
        kept = order[(torch.cumsum(mass, dim=0) - mass) < 0.8]
        want = torch.zeros(48, dtype=torch.float64)
        want[kept] = torch.softmax(scaled[kept], dim=0)
        torch.testing.assert_close(got[row].double(), want, atol=1e-6, rtol=1e-5)


def test_deterministic_drafts_are_lossless_with_one_hot_logits_and_biased_as_ids(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    """An n-gram draft is deterministic: with ``trtllm.draft_logits`` (the default) it goes to
    TensorRT-LLM with one-hot logits, whose p/q rule then accepts it with probability p: the first
    token follows the target's distribution. As token ids alone, TensorRT-LLM's rule (the target's
    own sample equals the draft, else a fresh sample) emits the drafted token with p (2 - p): the
    same test tells the two apart."""
    probs = target_distribution(NGRAM_PROMPT, temperature=0.5)
    lossless = first_tokens(
        engine_over(ngram_runner(tmp_path / "a", draft_logits=True)), NGRAM_PROMPT, temperature=0.5
    )
    assert chi_square_p_value(lossless, probs) > 1e-3
    biased = first_tokens(
        engine_over(ngram_runner(tmp_path / "b", draft_logits=False)), NGRAM_PROMPT, temperature=0.5
    )
    assert chi_square_p_value(biased, probs) < 1e-6
    assert biased[126] > lossless[126] and abs(lossless[126] / SAMPLES - float(probs[126])) < 0.1
    sent = [r for r in trtllm_bindings.Executor.enqueued if r.external_draft_tokens_config is not None]
    assert {r.external_draft_tokens_config.tokens[0] for r in sent} == {126}
    with_logits = [r for r in sent if r.external_draft_tokens_config.logits is not None]
    assert len(with_logits) == SAMPLES == len(sent) - SAMPLES


# -- contexts longer than the engine step -------------------------------------------------------------
LONG = [(7 * i) % 250 + 3 for i in range(270)]


def submit_long_and_short(llm: LLMEngine) -> tuple[list[int], list[list[int]]]:
    short = [[10, 20, 30], list(range(40, 55)), [99] * 9]
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=12, num_draft_tokens=4))
        for p in short
    ]
    return ids, short


def test_a_context_above_max_num_tokens_is_prefilled_in_chunks_beside_the_others(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    """Engines built with max_num_tokens 192, a 270-token prompt among three short ones: with chunked
    context (the default) every request finishes with the target's own tokens. Without it TensorRT-LLM
    fails every request in flight with "The number of context tokens (270) exceeds the limit"."""
    small = {"build_config__max_num_tokens": 192}
    llm = engine_over(runner_over(tmp_path, engine=small, draft_engine=small))
    ids, short = submit_long_and_short(llm)
    long_id = llm.add_request(GenerationRequest(prompt_token_ids=LONG, max_tokens=12, num_draft_tokens=4))
    outputs = drain(llm)
    for rid, prompt in [*zip(ids, short), (long_id, LONG)]:
        assert tokens_of(outputs[rid]) == reference_greedy(prompt, 12)
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH


def test_without_chunked_context_a_long_prompt_is_refused_naming_max_num_tokens(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    small = {"build_config__max_num_tokens": 192}
    runner = runner_over(tmp_path, chunked_context=False, engine=small, draft_engine=small)
    assert runner.max_context == 192 - 8 + 1  # a whole context with its 8 drafts fits one step
    llm = engine_over(runner)
    ids, short = submit_long_and_short(llm)
    with pytest.raises(InvalidInputError) as info:
        llm.add_request(GenerationRequest(prompt_token_ids=LONG, max_tokens=12, num_draft_tokens=4))
    assert "max_num_tokens 192" in info.value.message and "chunked_context" in info.value.message
    # a prompt that fits, but whose output would not, is refused too (the context grows each round)
    with pytest.raises(InvalidInputError, match="max_num_tokens"):
        llm.add_request(GenerationRequest(prompt_token_ids=LONG[:180], max_tokens=12))
    outputs = drain(llm)
    for rid, prompt in zip(ids, short):
        assert tokens_of(outputs[rid]) == reference_greedy(prompt, 12)
    sent = trtllm_bindings.Executor.enqueued
    assert (
        max(len(r.input_token_ids) + len(getattr(r.external_draft_tokens_config, "tokens", ())) for r in sent)
        <= 192
    )


# -- per-request refusals -------------------------------------------------------------------------------
def test_a_request_the_executor_refuses_fails_alone(tmp_path: Path, trtllm_bindings) -> None:  # type: ignore[no-untyped-def]
    """``LlmRequest::validate`` refuses per request: here the draft engine was rebuilt with
    max_input_len 40 under a runner that read 900, so the draft executor refuses every round of the
    one long sequence ("Prompt length ... exceeds maximum input length"). That sequence fails with the
    executor's message; the sequences in flight with it finish with the target's own tokens."""
    runner = runner_over(tmp_path, draft_engine={"build_config__max_input_len": 40}, draft_info_engine={})
    llm = engine_over(runner)
    ids, short = submit_long_and_short(llm)
    long_id = llm.add_request(
        GenerationRequest(prompt_token_ids=LONG[:60], max_tokens=12, num_draft_tokens=4)
    )
    outputs = drain(llm)
    failed = outputs[long_id][-1]
    assert failed.finish_reason is FinishReason.ERROR and "exceeds maximum input length (40)" in failed.error
    for rid, prompt in zip(ids, short):
        assert tokens_of(outputs[rid]) == reference_greedy(prompt, 12)
        assert outputs[rid][-1].finish_reason is FinishReason.LENGTH


def test_drafts_are_cut_to_what_validate_keeps_so_acceptance_counts_what_was_verified(
    tmp_path: Path, trtllm_bindings
) -> None:  # type: ignore[no-untyped-def]
    """Near max_input_len TensorRT-LLM silently cuts the drafts (prompt + drafts <= max_input_len)
    and near max_seq_len lowers max_tokens: the runner sends no more drafts than it would keep, and
    never a request it would edit, so every counted draft was verified."""
    limits = {"build_config__max_input_len": 60, "build_config__max_seq_len": 70 + 8}
    runner = runner_over(tmp_path, engine=limits, draft_engine={"build_config__max_seq_len": 90})
    assert runner.max_context == 60 - 8 + 1
    llm = engine_over(runner)
    prompt = LONG[:40]
    rid = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=13, num_draft_tokens=8))
    outputs = drain(llm)
    assert tokens_of(outputs[rid]) == reference_greedy(prompt, 13)
    verifies = runner.target.executor.received
    drafts = [
        len(r.external_draft_tokens_config.tokens) if r.external_draft_tokens_config else 0 for r in verifies
    ]
    assert max(drafts) == 8 and min(drafts) < 8  # cut near the end, not before
    for r, k in zip(verifies, drafts):
        assert len(r.input_token_ids) + k <= 60  # nothing for validate() to cut
        assert len(r.input_token_ids) + r.max_tokens + (k or 8) <= 78  # nor to lower
    assert llm.stats.draft_tokens == sum(drafts)
