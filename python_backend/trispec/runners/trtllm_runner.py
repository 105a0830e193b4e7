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
(``enable_block_reuse``), so re-sending the sequence costs only its new tokens. An executor error
fails only its sequence; a sequence whose result does not come back in time is cancelled
(``cancel_request``) and fails alone. Start-up (engines, KV budget, executors) is ``trtllm_setup``.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trispec.config import SpecDecConfig
from trispec.drafters.base import Drafter, DraftRequest
from trispec.runners.trtllm_engines import EngineInfo, context_limit
from trispec.runners.trtllm_executor import Completion, TrtllmExecutor
from trispec.runners.trtllm_sampling import draft_logits_for_acceptance
from trispec.sampling_params import SamplingParams
from trispec.step import KVUsage, SeqResult, SeqStep, StepPlan, StepResult

logger = logging.getLogger(__name__)

# A round of requests that takes longer than this is cancelled (a stuck executor must not hang the
# server); generous, since a cold long prompt prefills inside the round.
ROUND_TIMEOUT_S = 600.0
NO_END_ID = -1  # TensorRT-LLM's "no end token" (validate accepts [-1, vocab))


@dataclass
class _Seq:
    sampling: SamplingParams
    drafts: bool
    num_computed: int = 0
    rounds: int = 0
    base_seed: int = field(default_factory=lambda: secrets.randbits(63))


@dataclass
class _Draft:
    tokens: list[int]
    logits: Any = None  # [len(tokens), vocab] for TensorRT-LLM's p/q check, when sampled


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
        if draft is not None and drafter is not None:
            raise ValueError("either a draft engine or a model-free drafter, not both")
        self.target, self.target_info = target, target_info
        self.draft, self.draft_info, self.drafter = draft, draft_info, drafter
        self.end_id, self.pad_id = end_id, pad_id
        self.draft_logits = draft_logits
        self.chunked_context = chunked_context
        self.kv_tokens = kv_tokens
        self._max_context, self.max_context_note = context_limit(
            draft_info, target_info, num_draft_tokens, chunked_context=chunked_context
        )
        self._max_batch = min(e.max_batch_size for e in (target_info, draft_info) if e is not None)
        self._seqs: dict[int, _Seq] = {}

    @classmethod
    def from_config(cls, config: SpecDecConfig) -> TrtllmSpecRunner:
        """Read and cross-check both engines, plan the KV budget, start the executors."""
        from trispec.runners.trtllm_setup import start_runner

        return start_runner(cls, config)

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
    def can_draft(self) -> bool:
        return self.draft is not None or self.drafter is not None

    def can_admit(self, num_tokens: int) -> bool:
        return num_tokens <= self._max_context and len(self._seqs) < self._max_batch

    def add(self, seq_id: int, max_length: int, sampling: SamplingParams, drafts: bool) -> None:
        seq = _Seq(sampling, drafts)
        if sampling.seed is not None:
            seq.base_seed = sampling.seed
        self._seqs[seq_id] = seq

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

    def kv_usage(self) -> dict[str, KVUsage]:
        # estimated from our sequences (block reuse may keep more blocks warm than this counts)
        block = self.target_info.tokens_per_block
        used = sum(-(-s.num_computed // block) for s in self._seqs.values())
        usage = KVUsage(self.kv_tokens // block, min(used, self.kv_tokens // block), block)
        return {"target": usage, "drafter": usage} if self.draft is not None else {"target": usage}

    # -- the step ----------------------------------------------------------------------------
    def run(self, plan: StepPlan) -> StepResult:
        results: dict[int, SeqResult] = {}
        # TensorRT-LLM prefills (and chunks) a prompt itself when the sequence is first sent
        for step in plan.steps:
            if step.is_prompt_chunk:
                self._seqs[step.seq_id].num_computed = step.feed_to
                results[step.seq_id] = SeqResult(step.seq_id, num_computed=step.feed_to)
        decodes = []
        for step in plan.decodes:
            refusal = self._refusal(step)
            if refusal is None:
                decodes.append(step)
            else:
                results[step.seq_id] = self._failed(step, refusal)
        t0 = time.perf_counter()
        drafts, failed = self._draft(decodes)
        t1 = time.perf_counter()
        results.update(failed)
        results.update(self._verify([s for s in decodes if s.seq_id not in failed], drafts))
        return StepResult(results, t1 - t0, time.perf_counter() - t1)

    def _refusal(self, step: SeqStep) -> str | None:
        """A sequence the engines cannot take is failed here, alone: sent, TensorRT-LLM would fail
        it (over max_input_len) or every request in flight with it (a context over max_num_tokens
        without chunked context). The scheduler's context limit keeps requests from getting here."""
        length = len(step.token_ids)
        for role, engine in (("target", self.target_info), ("draft", self.draft_info)):
            if engine is None:
                continue
            if length > engine.max_input_len:
                return f"{length} tokens exceed the {role} engine's max_input_len ({engine.max_input_len})"
            if (
                not self.chunked_context
                and engine.max_num_tokens is not None
                and length > engine.max_num_tokens
            ):
                return (
                    f"a context of {length} tokens does not fit the {role} engine's max_num_tokens "
                    f"({engine.max_num_tokens}) with trtllm.chunked_context off"
                )
        return None

    def _draft_room(self, step: SeqStep) -> int:
        """Drafts TensorRT-LLM would keep for this sequence (``LlmRequest::validate`` cuts drafts past
        max_input_len and lowers max_tokens past max_seq_len, config.json's value), so that what is
        counted as drafted is what was verified."""
        length, target = len(step.token_ids), self.target_info
        room = min(
            step.num_draft_tokens,
            target.max_draft_len,
            target.max_input_len - length,
            (target.max_seq_len - length - 1) // 2,  # prompt + (k + 1) new + k drafts
        )
        if not self.chunked_context and target.max_num_tokens is not None:
            room = min(room, target.max_num_tokens - length)
        if self.draft_info is not None:
            room = min(room, self.draft_info.max_seq_len - length)
        return max(room, 0)

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

    def _draft(self, decodes: Sequence[SeqStep]) -> tuple[dict[int, _Draft], dict[int, SeqResult]]:
        wanted = {s.seq_id: self._draft_room(s) for s in decodes}
        drafting = [s for s in decodes if wanted[s.seq_id] > 0]
        drafts: dict[int, _Draft] = {}
        failed: dict[int, SeqResult] = {}
        if self.drafter is not None:
            requests = [
                DraftRequest(s.seq_id, s.token_ids, wanted[s.seq_id], s.sampling, None) for s in drafting
            ]
            for s, proposal in zip(drafting, self.drafter.propose(requests)):
                tokens = list(proposal.tokens)[: wanted[s.seq_id]]
                drafts[s.seq_id] = _Draft(tokens, self._one_hot_logits(s, tokens))
            return drafts, failed
        if self.draft is None or not drafting:
            return drafts, failed
        ids: dict[int, SeqStep] = {}
        for s in drafting:
            try:
                rid = self.draft.submit(
                    list(s.token_ids),
                    wanted[s.seq_id],
                    sampling=s.sampling,
                    seed=self._seed(s),
                    end_id=NO_END_ID,  # an end token is proposed like any other: the target judges it
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    return_logits=self._sends_logits(s),
                )
            except Exception as exc:
                failed[s.seq_id] = self._failed(s, f"draft request refused: {exc}")
                continue
            ids[rid] = s
        for rid, done in self.draft.collect(list(ids), ROUND_TIMEOUT_S).items():
            s = ids[rid]
            if done.error is not None:
                failed[s.seq_id] = self._failed(s, f"draft engine: {done.error}")
                continue
            tokens = done.tokens[: wanted[s.seq_id]]
            logits = None
            if self._sends_logits(s) and tokens:
                if done.logits is None:
                    failed[s.seq_id] = self._failed(s, "draft engine returned no generation logits")
                    continue
                rows = _logits_2d(done.logits)[: len(tokens)]
                logits = draft_logits_for_acceptance(rows, s.sampling, self.vocab_size)
            drafts[s.seq_id] = _Draft(tokens, logits)
        return drafts, failed

    def _sends_logits(self, step: SeqStep) -> bool:
        # greedy verification is exact token matching: logits would change nothing
        return self.draft_logits and not step.sampling.greedy

    def _one_hot_logits(self, step: SeqStep, tokens: list[int]) -> torch.Tensor | None:
        """A model-free draft is deterministic: its q is one-hot, which TensorRT-LLM's p/q rule turns
        into "accept with probability p(d), else draw from p without d" (lossless); ids alone would
        get its biased token-match rule."""
        if not self._sends_logits(step) or not tokens:
            return None
        logits = torch.full((len(tokens), self.vocab_size), float("-inf"))
        logits[torch.arange(len(tokens)), torch.as_tensor(tokens)] = 0.0
        return logits

    def _verify(self, decodes: Sequence[SeqStep], drafts: dict[int, _Draft]) -> dict[int, SeqResult]:
        results: dict[int, SeqResult] = {}
        ids: dict[int, tuple[SeqStep, _Draft, int]] = {}
        for s in decodes:
            draft = drafts.get(s.seq_id)
            if draft is None or not draft.tokens:
                draft = _Draft([])  # never an empty external draft: TensorRT-LLM asserts on one
            end_id = self._end_id(s)
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
        # the end token is not among the tokens, the finish reason says it came (fact sheet §0.1)
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
        return SeqResult(step.seq_id, tokens, len(draft), accepted, seq.num_computed)

    def _failed(self, step: SeqStep, error: str) -> SeqResult:
        logger.error("request %d failed: %s", step.seq_id, error)
        return SeqResult(step.seq_id, num_computed=step.num_computed, error=error)


def _logits_2d(logits: Any) -> Any:
    """Generation logits come back as ``[beams, max_tokens, vocab]`` (or ``[tokens, vocab]``): beam 0."""
    return logits[0] if getattr(logits, "dim", lambda: 2)() == 3 else logits
