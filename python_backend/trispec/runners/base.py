"""The runner seam: the scheduler plans, a runner executes.

A runner owns the models and their KV caches. The scheduler admits a sequence into it (``add``),
hands it one ``StepPlan`` per step (``run``) and releases the sequence when it finishes (``free``);
it never sees a tensor. KV blocks are taken as tokens arrive: before each step the scheduler asks
``room_for(steps)`` and, while the answer is no, preempts its most recently admitted sequence
(``preempt``: blocks freed, recomputed from its verified tokens when re-admitted).
``TorchSpecRunner`` (runners/torch_runner.py) drafts and verifies with our PyTorch engine; a
TensorRT-LLM runner sends the same plan to TensorRT-LLM's executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trispec.sampling_params import SamplingParams
from trispec.step import (
    Admitted,
    KVCacheMetrics,
    KVUsage,
    PrefixCacheReset,
    SeqStep,
    StepPlan,
    StepResult,
)


class SpecRunner(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + output) one sequence may reach."""
        ...

    @property
    def max_context_note(self) -> str:
        """What bounds ``max_context`` (an engine key and its value), for the refusal message."""
        ...

    @property
    def shapes_logits(self) -> bool:
        """Whether it applies penalties, bad words and min_tokens and reports log-probabilities
        (``logits_rules.py``); requests asking for them are refused otherwise."""
        ...

    @property
    def sampling_rule(self) -> str:
        """How it draws sampled tokens and checks drafts: "coupled" or "rejection"
        (``SamplingParams.rule``)."""
        ...

    @property
    def guided_drafts(self) -> bool:
        """Whether a guided sequence (``SamplingParams.grammar``) may draft: its runtime masks every
        verify row by the grammar's state after the drafts before it. Where not, guided sequences
        decode plain and a guided request asking for drafts is refused."""
        ...

    @property
    def can_draft(self) -> bool:
        """False when there is no drafter (then every step is plain decoding)."""
        ...

    def can_admit(
        self,
        token_ids: Sequence[int],
        sampling: SamplingParams,
        num_draft_tokens: int = 0,
        cache_salt: str = "",
    ) -> bool:
        """Whether a new sequence's first step (``token_ids`` and its drafts) fits in the target's free
        KV now, less what its prefix cache holds of them (none for a sequence that will not take from
        the cache: one asking for prompt log-probs), with room left for the running sequences to grow
        by a block each (fewer preemptions)."""
        ...

    def add(
        self,
        seq_id: int,
        max_length: int,
        sampling: SamplingParams,
        drafts: bool,
        token_ids: Sequence[int] = (),
        cache_salt: str = "",
    ) -> Admitted:
        """Admit a sequence of ``token_ids`` (its verified tokens) that may reach ``max_length``
        tokens, with its random state (seeded from ``sampling``; a preempted sequence re-admitted
        keeps the state it had). Returns how many of its tokens the target's cache already holds
        (its prefix cache, blocks shared with sequences of the same ``cache_salt``): the scheduler
        feeds only the rest, always at least the last; and, for a sequence that ``drafts``, how many
        a draft model's cache holds (what drafting would not have to catch up on)."""
        ...

    def room_for(self, steps: Sequence[SeqStep]) -> bool:
        """Whether the target's KV can take every step at once (fed tokens and drafts). A draft
        pool that cannot is the runner's own business: it drafts less."""
        ...

    def preempt(self, seq_id: int) -> None:
        """Free the sequence's KV blocks but keep its random state: it will be ``add``-ed again and
        recompute its verified tokens."""
        ...

    def run(self, plan: StepPlan) -> StepResult:
        """Execute one step for every sequence of the plan: feed, draft, verify, accept, and leave
        each sequence's caches holding exactly ``SeqResult.num_computed`` tokens. A sequence that
        fails on its own gets ``SeqResult.error``; the others are unaffected."""
        ...

    def cached_length(self, seq_id: int) -> int:
        """Tokens of the sequence the target's cache holds (introspection and tests)."""
        ...

    def free(self, seq_id: int) -> None:
        """Forget the sequence and return its KV blocks."""
        ...

    def kv_usage(self) -> dict[str, KVUsage]:
        """KV pools by name: ``target`` and, with a draft model, ``drafter``."""
        ...

    def reset_prefix_cache(self) -> dict[str, PrefixCacheReset]:
        """Empty every pool's prefix cache (by pool name, as ``kv_usage``) between two steps; running
        sequences go on unchanged. Raises ``NotImplementedError`` (saying why) where it cannot."""
        ...

    def kv_cache_metrics(self, seq_id: int) -> KVCacheMetrics | None:
        """The sequence's prompt in the target's KV pool (reused, missed and allocated blocks), as
        TensorRT-LLM reports it per request; None when not known (yet)."""
        ...
