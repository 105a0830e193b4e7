"""One request's state while it is waiting or running in the batch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from trispec.detokenize import StopTextTracker
from trispec.sampling_params import SamplingParams
from trispec.stats import AcceptanceStats
from trispec.step import KVCacheMetrics, PromptLogProbs, TokenAlternatives


class FinishReason(str, enum.Enum):
    LENGTH = "length"  # max_tokens reached
    STOP = "stop"  # end id / EOS or a stop string
    CANCELLED = "cancelled"
    ERROR = "error"
    # guided decoding: the grammar allowed no token (``error`` says why)
    GRAMMAR_DEAD_END = "grammar_dead_end"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    max_tokens: int
    num_draft_tokens: int
    sampling: SamplingParams
    text: StopTextTracker
    output_ids: list[int] = field(default_factory=list)
    # how many of ``token_ids`` the runner's caches hold (as the runner last reported it); every
    # token past it is fed in the sequence's next step
    num_computed: int = 0
    # admitted into the drafter too (a drafter exists and the request asked for drafts)
    drafts: bool = False
    # tokens a draft model's cache holds as of the sequence's last drafted round (drafter caches
    # fill lazily): the rest is what drafting now would first have to feed it
    draft_synced: int = 0
    # times its KV was freed under memory pressure (it then waits first in line to recompute)
    preemptions: int = 0
    # the scheduler's clock when the request arrived and when it was last admitted
    arrived_at: float = 0.0
    admitted_at: float = 0.0
    # wall clock (time.time_ns) of the first admission, for clients' perf metrics
    first_scheduled_ns: int | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    # the text of the first this-many output tokens goes to RequestOutput.skipped_text (a resumed stream)
    skip_output_tokens: int = 0
    # KV blocks are shared only among requests of the same salt ("": the shared namespace)
    cache_salt: str = ""
    # its prompt in the target's KV pool, as of its first verified token: blocks reused and taken,
    # prompt tokens the prefix cache held (perf metrics, OpenAI's cached_tokens)
    kv_metrics: KVCacheMetrics | None = None
    # prompt tokens 1.. scored so far (a request that asked for prompt log-probs), with alternatives
    prompt_log_probs: list[float] = field(default_factory=list)
    prompt_top_log_probs: list[TokenAlternatives] = field(default_factory=list)

    def take_prompt_scores(self, scores: PromptLogProbs) -> None:
        """Keep what a step scored of the prompt, in order; a recompute after preemption scores
        tokens again, maybe in other chunks: each is kept once."""
        skip = len(self.prompt_log_probs) + 1 - scores.first
        if not 0 <= skip < len(scores.log_probs):
            return
        self.prompt_log_probs.extend(scores.log_probs[skip:])
        if scores.top is not None:
            self.prompt_top_log_probs.extend(scores.top[skip:])

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_length(self) -> int:
        """The most tokens its KV may hold: drafts are capped so it never passes prompt + max_tokens."""
        return len(self.prompt_ids) + self.max_tokens

    @property
    def remaining_tokens(self) -> int:
        return self.max_tokens - len(self.output_ids)

    @property
    def end_ids(self) -> frozenset[int]:
        """Tokens that end it (resolved into its sampling settings, which also mask them until
        ``min_tokens``)."""
        return self.sampling.end_ids

    @property
    def keeps_its_k(self) -> bool:
        """Adaptive k leaves it alone: its output depends on its drafts (the rejection rule, seeded),
        or its drafts come from the caller's prediction (next to free: it drafts its own k)."""
        return self.sampling.output_depends_on_drafts or bool(self.sampling.prediction)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
