"""``TrtllmSpecRunner``: our draft-verify loop over TensorRT-LLM engines (``engine.kind: trtllm``).

TensorRT-LLM owns the KV caches and the batching inside each executor; the runner only says "this
sequence, these draft tokens". Per step, for every running sequence at once:
  1. draft: one request per drafting sequence to the draft executor (the whole sequence, k new
     tokens, no end token so that an end token can be proposed, generation logits when sampling) —
     or our own model-free drafter (n-gram) with no draft engine;
  2. verify: one request per sequence to the target executor with the draft as
     ``ExternalDraftTokensConfig`` and room for len(draft) + 1 tokens, the request's own end id. The
     target returns the accepted drafts and then its own tokens; an end token never comes back as a
     token, only as ``finish_reasons == END_ID``, so it is put back here. A sequence with no draft
     sends a plain one-token request (TensorRT-LLM asserts on an empty draft list).
Sampled requests send the draft's distribution as logits (``trtllm_sampling``), so TensorRT-LLM's
p/q check is the lossless rule; drafts are cut here to what ``LlmRequest::validate`` would keep, so
acceptance statistics count what was really verified. Both executors reuse KV blocks across rounds
(``enable_block_reuse``), so re-sending the sequence costs only its new tokens, and a new request
reuses what earlier ones left (its prefix cache; a cache salt goes along as ``cache_salt_id``). A
sequence's first target request asks for the executor's perf metrics, whose ``kv_cache_metrics`` are
what it reports as its reused blocks and hit rate. An executor error
fails only its sequence; a sequence whose result does not come back in time is cancelled
(``cancel_request``) and fails alone. Start-up (engines, KV budget, executors) is ``trtllm_setup``.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from trispec.drafters.base import Drafter
from trispec.guided.compiler import CompiledGrammar
from trispec.guided.state import GrammarState
from trispec.runners.trtllm_drafting import NO_END_ID, Draft, TrtllmDrafting
from trispec.runners.trtllm_engines import EngineInfo, context_limit, draft_room, refusal
from trispec.runners.trtllm_executor import Completion, TrtllmExecutor
from trispec.sampling_params import SamplingParams
from trispec.step import (
    GRAMMAR_COMPLETE,
    Admitted,
    KVCacheMetrics,
    KVUsage,
    PrefixCacheReset,
    SeqResult,
    SeqStep,
    StepPlan,
    StepResult,
)

logger = logging.getLogger(__name__)

# A round of requests that takes longer than this is cancelled (a stuck executor must not hang the
# server); generous, since a cold long prompt prefills inside the round.
ROUND_TIMEOUT_S = 600.0


@dataclass
class _Seq:
    sampling: SamplingParams
    drafts: bool
    max_length: int = 0
    num_computed: int = 0
    rounds: int = 0
    base_seed: int = field(default_factory=lambda: secrets.randbits(63))
    salt_id: int | None = None
    # the executor's kv_cache_metrics of its first target request (its prompt)
    kv: KVCacheMetrics | None = None


def cache_salt_id(cache_salt: str) -> int | None:
    """A salt as TensorRT-LLM's ``Request.cache_salt_id``: a 64-bit id of its text (None: no salt)."""
    if not cache_salt:
        return None
    return int.from_bytes(hashlib.sha256(cache_salt.encode("utf-8")).digest()[:8], "little")


class TrtllmSpecRunner:
    def __init__(
        self,
        target: TrtllmExecutor,
        target_info: EngineInfo,
        *,
        draft: TrtllmExecutor | None = None,
        drafter: Drafter | None = None,
        kv_tokens: int,
        num_draft_tokens: int,
        draft_info: EngineInfo | None = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        draft_logits: bool = True,
        chunked_context: bool = True,
    ) -> None:
        self.drafting = TrtllmDrafting(
            draft, drafter, target_info.vocab_size, draft_logits=draft_logits, pad_id=pad_id
        )
        self.target, self.target_info = target, target_info
        self.draft, self.draft_info, self.drafter = draft, draft_info, drafter
        self.end_id, self.pad_id = end_id, pad_id
        self.chunked_context = chunked_context
        self.kv_tokens = kv_tokens
        self._max_context, self.max_context_note = context_limit(
            draft_info, target_info, num_draft_tokens, chunked_context=chunked_context
        )
        self._max_batch = min(e.max_batch_size for e in (target_info, draft_info) if e is not None)
        self._seqs: dict[int, _Seq] = {}

    @property
    def draft_logits(self) -> bool:
        """Whether sampled requests' drafts go with logits (``trtllm.draft_logits``)."""
        return self.drafting.draft_logits

    @draft_logits.setter
    def draft_logits(self, value: bool) -> None:
        self.drafting.draft_logits = value

    # -- admission ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.target_info.vocab_size

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def shapes_logits(self) -> bool:
        # not passed to the executors yet (SamplingConfig penalties, Request.bad_words, min_tokens
        # per round, OutputConfig.return_log_probs): refused rather than ignored
        return False

    @property
    def sampling_rule(self) -> str:
        # TensorRT-LLM samples and checks drafts inside its executor (p/q with a residual resample)
        return "rejection"

    @property
    def can_draft(self) -> bool:
        return self.draft is not None or self.drafter is not None

    def can_admit(
        self,
        token_ids: Sequence[int],
        sampling: SamplingParams,
        num_draft_tokens: int = 0,
        cache_salt: str = "",
    ) -> bool:
        return len(token_ids) + num_draft_tokens <= self._max_context and len(self._seqs) < self._max_batch

    # guide types refused before admission, with the reason
    guide_refusals: ClassVar[dict[str, str]] = {
        "structural_tag": "structural_tag is not served on TensorRT-LLM's C++ runtime: its xgrammar "
        "backend refuses kSTRUCTURAL_TAG (cpp/tensorrt_llm/batch_manager/xgrammarFactory.cpp, "
        "XGrammarMatcherFactory::Create)"
    }

    @property
    def guided_drafts(self) -> bool:
        # TensorRT-LLM 1.2.x's GuidedDecoder advances its matcher by the last token of a step only and
        # masks one logits row per request (batch_manager/guidedDecoder.cpp, build and execute): it
        # cannot check drafts. Guided sequences decode plain, each as one request (``_guided``).
        return False

    def add(
        self,
        seq_id: int,
        max_length: int,
        sampling: SamplingParams,
        drafts: bool,
        token_ids: Sequence[int] = (),
        cache_salt: str = "",
    ) -> Admitted:
        seq = _Seq(sampling, drafts, max_length, salt_id=cache_salt_id(cache_salt))
        if sampling.seed is not None:
            seq.base_seed = sampling.seed
        self._seqs[seq_id] = seq
        # the executors find reusable blocks themselves when the first round is sent (reported from
        # their own metrics); the scheduler feeds the whole prompt in our books
        return Admitted(0)

    def room_for(self, steps: Sequence[SeqStep]) -> bool:
        # each round is a request to the executors, whose own capacity scheduler queues it until
        # its KV blocks are free: rounds wait there instead of being preempted here
        return True

    def preempt(self, seq_id: int) -> None:
        # the executors keep no state of ours between rounds beyond reusable blocks: recomputing
        # from the verified tokens is what the next round does anyway
        self._seqs[seq_id].num_computed = 0

    def free(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    def cached_length(self, seq_id: int) -> int:
        # what the executors can reuse from their KV blocks: the tokens verified so far but the last
        return self._seqs[seq_id].num_computed

    def kv_cache_metrics(self, seq_id: int) -> KVCacheMetrics | None:
        seq = self._seqs.get(seq_id)
        return None if seq is None else seq.kv

    def kv_usage(self) -> dict[str, KVUsage]:
        # estimated from our sequences (block reuse may keep more blocks warm than this counts)
        block = self.target_info.tokens_per_block
        used = sum(-(-s.num_computed // block) for s in self._seqs.values())
        usage = KVUsage(self.kv_tokens // block, min(used, self.kv_tokens // block), block)
        return {"target": usage, "drafter": usage} if self.draft is not None else {"target": usage}

    def reset_prefix_cache(self) -> dict[str, PrefixCacheReset]:
        # the reuse cache is the executors' own, inside TensorRT-LLM; this runner has no call into it
        raise NotImplementedError(
            "the TensorRT-LLM runner (engine.kind trtllm) cannot empty its executors' KV reuse cache; "
            "restart the server to empty it"
        )

    # -- the step ----------------------------------------------------------------------------
    def run(self, plan: StepPlan) -> StepResult:
        results: dict[int, SeqResult] = {}
        # TensorRT-LLM prefills (and chunks) a prompt itself when the sequence is first sent
        for step in plan.steps:
            if step.is_prompt_chunk:
                self._seqs[step.seq_id].num_computed = step.feed_to
                results[step.seq_id] = SeqResult(step.seq_id, num_computed=step.feed_to)
        decodes, guided = [], []
        for step in plan.decodes:
            refusal = self._refusal(step)
            if refusal is not None:
                results[step.seq_id] = self._failed(step, refusal)
            else:
                (guided if step.sampling.guided else decodes).append(step)
        results.update(self._guided(guided))
        t0 = time.perf_counter()
        wanted = {s.seq_id: self._draft_room(s) for s in decodes}
        seeds = {s.seq_id: self._seed(s) for s in decodes}
        salts = {s.seq_id: self._seqs[s.seq_id].salt_id for s in decodes}
        drafts, failed = self.drafting.propose(decodes, wanted, seeds, ROUND_TIMEOUT_S, salts)
        t1 = time.perf_counter()
        for s in decodes:
            if s.seq_id in failed:
                results[s.seq_id] = self._failed(s, failed[s.seq_id])
        results.update(self._verify([s for s in decodes if s.seq_id not in failed], drafts))
        return StepResult(results, t1 - t0, time.perf_counter() - t1)

    def _guided(self, steps: Sequence[SeqStep]) -> dict[int, SeqResult]:
        """Guided sequences: the executor's grammar state lives in its request (built at the first
        context step, advanced by each generated token), so each is ONE request for all its output,
        masked at every step by the runtime, rather than a request per round. The request's end is
        the grammar's stop token (``_grammar_end_id``); the end ids in the text are then text, and the
        first one where the grammar may end ends the request, as on the torch runner."""
        results: dict[int, SeqResult] = {}
        ids: dict[int, tuple[SeqStep, int, CompiledGrammar]] = {}
        for s in steps:
            seq = self._seqs[s.seq_id]
            if len(s.token_ids) > s.sampling.prompt_len:
                results[s.seq_id] = self._failed(
                    s,
                    "a guided sequence cannot go on mid-output on TensorRT-LLM (its grammar state was in "
                    "the request that ended)",
                )
                continue
            grammar = s.sampling.grammar
            assert grammar is not None
            end_id = self._grammar_end_id(s)
            try:
                rid = self.target.submit(
                    list(s.token_ids),
                    seq.max_length - len(s.token_ids),
                    sampling=s.sampling,
                    seed=self._seed(s) + 1,
                    end_id=end_id,
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    guide=grammar.guide,
                )
            except Exception as exc:
                results[s.seq_id] = self._failed(s, f"target request refused: {exc}")
                continue
            ids[rid] = (s, end_id, grammar)
        for rid, done in self.target.collect(list(ids), ROUND_TIMEOUT_S).items():
            s, end_id, grammar = ids[rid]
            if done.error is not None:
                results[s.seq_id] = self._failed(s, f"target engine: {done.error}")
                continue
            tokens, grammar_end = list(done.tokens), None
            if done.ended:  # on the grammar's stop token, where the grammar may end: the request's end
                ends = s.sampling.end_ids
                if ends:
                    tokens.append(end_id if end_id in ends else self._end_id(s))
                else:
                    grammar_end = GRAMMAR_COMPLETE
            if not tokens and grammar_end is None:
                results[s.seq_id] = self._failed(s, "target engine returned no token")
                continue
            seq = self._seqs[s.seq_id]
            seq.num_computed = s.feed_to + max(len(tokens) - 1, 0)
            # the runtime's own end is the end; before it, end ids where the grammar may not end are text
            state = GrammarState(grammar, s.sampling.end_ids, len(s.token_ids), self.vocab_size)
            text = state.text_end_ids(done.tokens)
            results[s.seq_id] = SeqResult(
                s.seq_id, tokens, 0, 0, seq.num_computed, grammar_end=grammar_end, end_ids_as_text=text
            )
        return results

    def _grammar_end_id(self, step: SeqStep) -> int:
        """A guided request's end id for TensorRT-LLM: the tokenizer's end token, which the runtime's
        xgrammar allows exactly where the grammar may end (its ``stop_token_ids``: xgrammar
        cpp/grammar_matcher.cc ``FillNextTokenBitmask`` adds them where ``can_reach_end``), not the
        request's: the runtime's decoder stops on its end id wherever it comes, so a newline end id
        the grammar allows as text would cut the answer there. Without one, the request's own."""
        return self.end_id if self.end_id is not None else self._end_id(step)

    def _refusal(self, step: SeqStep) -> str | None:
        # the scheduler's context limit keeps requests from getting here
        return refusal(len(step.token_ids), self.target_info, self.draft_info, self.chunked_context)

    def _draft_room(self, step: SeqStep) -> int:
        length, info = len(step.token_ids), self.target_info
        return draft_room(length, step.num_draft_tokens, info, self.draft_info, self.chunked_context)

    def _seed(self, step: SeqStep) -> int:
        # every round is a new request: derive its seed from the request's and the position, so a
        # seeded request draws the same numbers on every run and different ones each round
        seq = self._seqs[step.seq_id]
        return (seq.base_seed * 1_000_003 + len(step.token_ids)) % (2**63)

    def _end_id(self, step: SeqStep) -> int:
        """The request's end token for TensorRT-LLM (one per request): the tokenizer's when it is
        among the request's end ids, -1 when it has none (the scheduler still checks every end id)."""
        ends = step.sampling.end_ids
        if not ends:
            return NO_END_ID
        return self.end_id if self.end_id in ends else min(ends)

    def _verify(self, decodes: Sequence[SeqStep], drafts: dict[int, Draft]) -> dict[int, SeqResult]:
        results: dict[int, SeqResult] = {}
        ids: dict[int, tuple[SeqStep, Draft, int]] = {}
        for s in decodes:
            draft = drafts.get(s.seq_id)
            if draft is None or not draft.tokens:
                draft = Draft([])  # never an empty external draft: TensorRT-LLM asserts on one
            end_id = self._end_id(s)
            seq = self._seqs[s.seq_id]
            try:
                rid = self.target.submit(
                    list(s.token_ids),
                    len(draft.tokens) + 1,
                    sampling=s.sampling,
                    seed=self._seed(s) + 1,
                    end_id=end_id,
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    draft_tokens=draft.tokens or None,
                    draft_logits=draft.logits,
                    perf_metrics=seq.kv is None,
                    cache_salt_id=seq.salt_id,
                )
            except Exception as exc:
                results[s.seq_id] = self._failed(s, f"target request refused: {exc}")
                continue
            ids[rid] = (s, draft, end_id)
        for rid, done in self.target.collect(list(ids), ROUND_TIMEOUT_S).items():
            s, draft, end_id = ids[rid]
            results[s.seq_id] = self._accepted(s, draft.tokens, done, end_id)
        return results

    def _accepted(self, step: SeqStep, draft: list[int], done: Completion, end_id: int) -> SeqResult:
        if done.error is not None:
            return self._failed(step, f"target engine: {done.error}")
        # the end token is never among the tokens: finish_reasons END_ID says it came (docs/tensorrt-llm.md)
        tokens = [*done.tokens, end_id] if done.ended else list(done.tokens)
        tokens = tokens[: len(draft) + 1]
        if not tokens:
            return self._failed(step, "target engine returned no token")
        # the accepted drafts come first; after a rejection the target's own tokens follow (it
        # decodes on up to len(draft) + 1), every one of them the target's
        accepted = 0
        while accepted < min(len(draft), len(tokens)) and tokens[accepted] == draft[accepted]:
            accepted += 1
        seq = self._seqs[step.seq_id]
        seq.num_computed = step.feed_to + len(tokens) - 1
        seq.rounds += 1
        if seq.kv is None and done.kv is not None:
            # the executor reports reused blocks, not tokens (executor.h Result.requestPerfMetrics;
            # prepopulatedPromptLen stays in its batch manager). It matches past a block only when it
            # reused it whole, so only the last reused block may hold part of the prompt, and how much
            # it does not say (kvCacheManager.cpp loadOrAllocateBlocks): count the whole ones before it
            whole = max(done.kv.reused_blocks - 1, 0)
            seq.kv = replace(done.kv, cached_tokens=whole * self.target_info.tokens_per_block)
        return SeqResult(step.seq_id, tokens, len(draft), accepted, seq.num_computed)

    def _failed(self, step: SeqStep, error: str) -> SeqResult:
        logger.error("request %d failed: %s", step.seq_id, error)
        return SeqResult(step.seq_id, num_computed=step.num_computed, error=error)
