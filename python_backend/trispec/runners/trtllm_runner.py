"""``TrtllmSpecRunner``: our draft-verify loop over TensorRT-LLM engines (``engine.kind: trtllm``).

TensorRT-LLM owns the KV caches and the batching inside each executor; the runner only says "this
sequence, these draft tokens". Per step, for every running sequence at once:
  1. draft: one request per drafting sequence to the draft executor (the whole sequence, k new
     tokens, the input excluded from the output, generation logits when sampling) — or our own
     model-free drafter (n-gram) with no draft engine;
  2. verify: one request per sequence to the target executor with the draft as
     ``ExternalDraftTokensConfig`` and room for len(draft) + 1 tokens; the target returns the accepted
     drafts plus one token of its own. A sequence with no draft sends a plain one-token request
     (TensorRT-LLM asserts on an empty draft list).
Both executors reuse KV blocks across rounds (``enable_block_reuse``), so re-sending the sequence
costs only its new tokens. An executor error fails only its sequence; a sequence whose result does
not come back in time is cancelled (``cancel_request``) and fails alone.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trispec.config import SpecDecConfig
from trispec.drafters.base import Drafter, DraftRequest
from trispec.runners.kv_budget import KVSplit, split_kv_budget
from trispec.runners.trtllm_engines import EngineInfo, check_pair, max_context, read_engine
from trispec.runners.trtllm_executor import Completion, TrtllmExecutor
from trispec.sampling_params import SamplingParams
from trispec.step import KVUsage, SeqResult, SeqStep, StepPlan, StepResult

logger = logging.getLogger(__name__)

# A round of requests that takes longer than this is cancelled (a stuck executor must not hang the
# server); generous, since a cold long prompt prefills inside the round.
ROUND_TIMEOUT_S = 600.0


@dataclass
class _Seq:
    sampling: SamplingParams
    drafts: bool
    num_computed: int = 0
    rounds: int = 0
    base_seed: int = field(default_factory=lambda: secrets.randbits(63))


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
    ) -> None:
        if draft is not None and drafter is not None:
            raise ValueError("either a draft engine or a model-free drafter, not both")
        self.target, self.target_info = target, target_info
        self.draft, self.drafter = draft, drafter
        self.end_id, self.pad_id = end_id, pad_id
        self.draft_logits = draft_logits
        self.kv_tokens = kv_tokens
        self._max_context = max_context(draft_info, target_info, num_draft_tokens)
        self._max_batch = min(e.max_batch_size for e in (target_info, draft_info) if e is not None)
        self._seqs: dict[int, _Seq] = {}

    @classmethod
    def from_config(cls, config: SpecDecConfig) -> TrtllmSpecRunner:
        """Read and cross-check both engines, split the KV budget, start the executors."""
        from trispec.checkpoints import load_tokenizer
        from trispec.drafters.factory import model_free_drafter
        from trispec.errors import ConfigError

        trt = config.trtllm
        assert trt is not None
        k = config.scheduler.max_num_draft_tokens
        target_info = read_engine(trt.target_engine_dir)
        draft_info = read_engine(trt.draft_engine_dir) if config.drafter.kind in ("model", "self") else None
        if config.drafter.with_suffix:
            raise ConfigError("drafter.with_suffix", "not available with engine.kind trtllm yet")
        problems = check_pair(draft_info, target_info, k)
        if problems:
            raise ConfigError("trtllm", "the engines do not fit together:\n  " + "\n  ".join(problems))
        split = kv_split(config, target_info, draft_info)
        print(f"specdec: {split.describe()}", flush=True)
        logger.info("%s", split.describe())
        tokenizer = load_tokenizer(config.target, "target")
        common = {
            "kv_cache_tokens": split.tokens,
            "device_ids": trt.gpu_ids,
            "worker_executable": trt.executor_worker,
        }
        target = TrtllmExecutor(trt.target_engine_dir, **common)
        draft = None
        if draft_info is not None:
            draft = TrtllmExecutor(trt.draft_engine_dir, gather_generation_logits=trt.draft_logits, **common)
        drafter = model_free_drafter(config, target_info.vocab_size)
        return cls(
            target,
            target_info,
            draft=draft,
            drafter=drafter,
            kv_tokens=split.tokens,
            num_draft_tokens=k,
            draft_info=draft_info,
            end_id=tokenizer.eos_id,
            pad_id=tokenizer.info.pad_id if tokenizer.info.pad_id is not None else tokenizer.eos_id,
            draft_logits=trt.draft_logits,
        )

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
        decodes = plan.decodes
        t0 = time.perf_counter()
        drafts, draft_logits, failed = self._draft(decodes)
        t1 = time.perf_counter()
        results.update(failed)
        results.update(self._verify([s for s in decodes if s.seq_id not in failed], drafts, draft_logits))
        return StepResult(results, t1 - t0, time.perf_counter() - t1)

    def _seed(self, step: SeqStep) -> int:
        # every round is a new request: derive its seed from the request's and the position, so a
        # seeded request draws the same numbers on every run and different ones each round
        seq = self._seqs[step.seq_id]
        return (seq.base_seed * 1_000_003 + len(step.token_ids)) % (2**63)

    def _draft(
        self, decodes: Sequence[SeqStep]
    ) -> tuple[dict[int, list[int]], dict[int, Any], dict[int, SeqResult]]:
        drafting = [s for s in decodes if s.num_draft_tokens > 0]
        drafts: dict[int, list[int]] = {}
        logits: dict[int, Any] = {}
        failed: dict[int, SeqResult] = {}
        if self.drafter is not None:
            requests = [
                DraftRequest(s.seq_id, s.token_ids, s.num_draft_tokens, s.sampling, None) for s in drafting
            ]
            for s, proposal in zip(drafting, self.drafter.propose(requests)):
                drafts[s.seq_id] = proposal.tokens
            return drafts, logits, failed
        if self.draft is None or not drafting:
            return drafts, logits, failed
        ids: dict[int, SeqStep] = {}
        for s in drafting:
            want_logits = self.draft_logits and not s.sampling.greedy
            try:
                rid = self.draft.submit(
                    list(s.token_ids),
                    s.num_draft_tokens,
                    sampling=s.sampling,
                    seed=self._seed(s),
                    end_id=self.end_id,
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    return_logits=want_logits,
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
            drafts[s.seq_id] = done.tokens[: s.num_draft_tokens]
            if done.logits is not None:
                logits[s.seq_id] = _logits_2d(done.logits)[: len(drafts[s.seq_id])]
        return drafts, logits, failed

    def _verify(
        self, decodes: Sequence[SeqStep], drafts: dict[int, list[int]], draft_logits: dict[int, Any]
    ) -> dict[int, SeqResult]:
        results: dict[int, SeqResult] = {}
        ids: dict[int, SeqStep] = {}
        for s in decodes:
            # never an empty external draft (TensorRT-LLM asserts), and never more than the engine's
            # max_draft_len: that error surfaces in the executor's next iteration and fails every
            # request in flight on it, not only this one
            draft = drafts.get(s.seq_id, [])[: self.target_info.max_draft_len] or None
            drafts[s.seq_id] = draft or []
            try:
                rid = self.target.submit(
                    list(s.token_ids),
                    len(draft or ()) + 1,
                    sampling=s.sampling,
                    seed=self._seed(s) + 1,
                    end_id=self.end_id,
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    draft_tokens=draft,
                    draft_logits=draft_logits.get(s.seq_id) if draft else None,
                )
            except Exception as exc:
                results[s.seq_id] = self._failed(s, f"target request refused: {exc}")
                continue
            ids[rid] = s
        for rid, done in self.target.collect(list(ids), ROUND_TIMEOUT_S).items():
            s = ids[rid]
            results[s.seq_id] = self._accepted(s, drafts.get(s.seq_id, []), done)
        return results

    def _accepted(self, step: SeqStep, draft: list[int], done: Completion) -> SeqResult:
        if done.error is not None:
            return self._failed(step, f"target engine: {done.error}")
        if not done.tokens:
            return self._failed(step, "target engine returned no token")
        tokens = done.tokens[: len(draft) + 1]
        # the target verifies the drafts with the prompt's prefill step and returns the accepted ones
        # plus its own token; whether it stops there or decodes on up to len(draft) + 1 is not
        # documented, and either way every token it returns is the target's own
        accepted = 0
        while accepted < min(len(draft), len(tokens) - 1) and tokens[accepted] == draft[accepted]:
            accepted += 1
        seq = self._seqs[step.seq_id]
        seq.num_computed = step.feed_to + len(tokens) - 1
        seq.rounds += 1
        return SeqResult(step.seq_id, tokens, len(draft), accepted, seq.num_computed)

    def _failed(self, step: SeqStep, error: str) -> SeqResult:
        logger.error("request %d failed: %s", step.seq_id, error)
        return SeqResult(step.seq_id, num_computed=step.num_computed, error=error)


def _logits_2d(logits: Any) -> Any:
    """Generation logits come back as ``[beams, tokens, vocab]`` (or ``[tokens, vocab]``): beam 0."""
    return logits[0] if getattr(logits, "dim", lambda: 2)() == 3 else logits


def kv_split(config: SpecDecConfig, target: EngineInfo, draft: EngineInfo | None) -> KVSplit:
    """Split ``trtllm.kv_cache`` (GiB, or a fraction of the free GPU memory) between the executors."""
    trt = config.trtllm
    assert trt is not None
    if trt.kv_cache.gib is not None:
        budget = trt.kv_cache.gib * 2**30
    else:
        budget = trt.kv_cache.gpu_fraction * free_gpu_memory(trt.gpu_ids[0])  # type: ignore[operator]
    draft_bpt = draft.kv_bytes_per_token() if draft is not None else 0.0
    return split_kv_budget(budget, target.kv_bytes_per_token(), draft_bpt, target.tokens_per_block)


def free_gpu_memory(device: int) -> int:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return int(free)
