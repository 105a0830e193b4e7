"""The runner seam: the scheduler plans, a runner executes.

A runner owns the models and their KV caches. The scheduler admits a sequence into it (``add``),
hands it one ``StepPlan`` per step (``run``) and releases the sequence when it finishes (``free``);
it never sees a tensor. ``TorchSpecRunner`` (runners/torch_runner.py) drafts and verifies with our
PyTorch engine; a TensorRT-LLM runner sends the same plan to TensorRT-LLM's executors.
"""

from __future__ import annotations

from typing import Protocol

from trispec.sampling_params import SamplingParams
from trispec.step import KVUsage, StepPlan, StepResult


class SpecRunner(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + output) one sequence may reach."""
        ...

    @property
    def can_draft(self) -> bool:
        """False when there is no drafter (then every step is plain decoding)."""
        ...

    def can_admit(self, max_length: int, drafts: bool) -> bool:
        """Whether a sequence of up to ``max_length`` tokens fits now (in the draft pool too when it
        ``drafts``)."""
        ...

    def add(self, seq_id: int, max_length: int, sampling: SamplingParams, drafts: bool) -> None:
        """Admit a sequence: reserve its KV room and its random state (seeded from ``sampling``)."""
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
