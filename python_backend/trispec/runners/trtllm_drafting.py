"""Drafts for the TensorRT-LLM runner, with what TensorRT-LLM's acceptance needs to go with them.

From the draft engine's executor: one request per drafting sequence (the whole sequence, k new
tokens, no end token so that an end token can be proposed like any other, generation logits when the
request samples). Or from our model-free drafter, with no draft engine. A sampled request's draft
goes with logits whose plain softmax is the distribution it was drawn from (``trtllm_sampling``): the
draft engine's raw logits divided by the temperature and masked, or one-hot for a deterministic
model-free draft, so that TensorRT-LLM's p/q rule is the lossless one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trispec.drafters.base import Drafter, DraftRequest
from trispec.runners.trtllm_executor import TrtllmExecutor
from trispec.runners.trtllm_sampling import draft_logits_for_acceptance
from trispec.step import SeqStep

NO_END_ID = -1  # TensorRT-LLM's "no end token" (validate accepts [-1, vocab))


@dataclass
class Draft:
    tokens: list[int]
    logits: Any = None  # [len(tokens), vocab] for TensorRT-LLM's p/q check, when sampled


class TrtllmDrafting:
    def __init__(
        self,
        draft: TrtllmExecutor | None,
        drafter: Drafter | None,
        vocab_size: int,
        *,
        draft_logits: bool,
        pad_id: int | None,
    ) -> None:
        if draft is not None and drafter is not None:
            raise ValueError("either a draft engine or a model-free drafter, not both")
        self.draft, self.drafter = draft, drafter
        self.vocab_size = vocab_size
        self.draft_logits = draft_logits
        self.pad_id = pad_id

    def sends_logits(self, step: SeqStep) -> bool:
        # greedy verification is exact token matching: logits would change nothing
        return self.draft_logits and not step.sampling.greedy

    def propose(
        self,
        steps: Sequence[SeqStep],
        wanted: Mapping[int, int],
        seeds: Mapping[int, int],
        timeout_s: float,
        salt_ids: Mapping[int, int | None] | None = None,
    ) -> tuple[dict[int, Draft], dict[int, str]]:
        """Up to ``wanted[seq_id]`` drafts for each step that wants any; the errors of sequences whose
        draft failed (they fail alone). ``salt_ids``: each sequence's cache salt id (the executor reuses
        KV blocks only among requests with the same)."""
        drafting = [s for s in steps if wanted[s.seq_id] > 0]
        if self.drafter is not None:
            return self._model_free(drafting, wanted), {}
        if self.draft is None or not drafting:
            return {}, {}
        return self._from_engine(self.draft, drafting, wanted, seeds, timeout_s, salt_ids or {})

    def _model_free(self, steps: Sequence[SeqStep], wanted: Mapping[int, int]) -> dict[int, Draft]:
        assert self.drafter is not None
        requests = [DraftRequest(s.seq_id, s.token_ids, wanted[s.seq_id], s.sampling, None) for s in steps]
        drafts = {}
        for s, proposal in zip(steps, self.drafter.propose(requests)):
            tokens = list(proposal.tokens)[: wanted[s.seq_id]]
            drafts[s.seq_id] = Draft(tokens, self._one_hot_logits(s, tokens))
        return drafts

    def _from_engine(
        self,
        draft: TrtllmExecutor,
        steps: Sequence[SeqStep],
        wanted: Mapping[int, int],
        seeds: Mapping[int, int],
        timeout_s: float,
        salt_ids: Mapping[int, int | None],
    ) -> tuple[dict[int, Draft], dict[int, str]]:
        drafts: dict[int, Draft] = {}
        failed: dict[int, str] = {}
        ids: dict[int, SeqStep] = {}
        for s in steps:
            try:
                rid = draft.submit(
                    list(s.token_ids),
                    wanted[s.seq_id],
                    sampling=s.sampling,
                    seed=seeds[s.seq_id],
                    end_id=NO_END_ID,  # an end token is proposed like any other: the target judges it
                    pad_id=self.pad_id,
                    client_id=s.seq_id,
                    return_logits=self.sends_logits(s),
                    cache_salt_id=salt_ids.get(s.seq_id),
                )
            except Exception as exc:
                failed[s.seq_id] = f"draft request refused: {exc}"
                continue
            ids[rid] = s
        for rid, done in draft.collect(list(ids), timeout_s).items():
            s = ids[rid]
            if done.error is not None:
                failed[s.seq_id] = f"draft engine: {done.error}"
                continue
            tokens = done.tokens[: wanted[s.seq_id]]
            logits = None
            if self.sends_logits(s) and tokens:
                if done.logits is None:
                    failed[s.seq_id] = "draft engine returned no generation logits"
                    continue
                rows = _logits_2d(done.logits)[: len(tokens)]
                logits = draft_logits_for_acceptance(rows, s.sampling, self.vocab_size)
            drafts[s.seq_id] = Draft(tokens, logits)
        return drafts, failed

    def _one_hot_logits(self, step: SeqStep, tokens: list[int]) -> torch.Tensor | None:
        """A model-free draft is deterministic: its q is one-hot, which TensorRT-LLM's p/q rule turns
        into "accept with probability p(d), else draw from p without d" (lossless); ids alone would
        get its biased token-match rule."""
        if not self.sends_logits(step) or not tokens:
            return None
        logits = torch.full((len(tokens), self.vocab_size), float("-inf"))
        logits[torch.arange(len(tokens)), torch.as_tensor(tokens)] = 0.0
        return logits


def _logits_2d(logits: Any) -> Any:
    """Generation logits come back as ``[beams, max_tokens, vocab]`` (or ``[tokens, vocab]``): beam 0."""
    return logits[0] if getattr(logits, "dim", lambda: 2)() == 3 else logits
