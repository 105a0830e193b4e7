"""What crosses the runner seam: the scheduler's plan for one step and the runner's result.

Plain data, no tensors: a runner may keep its KV cache on a GPU, in another process or inside
TensorRT-LLM's executor; all it gets is "these tokens, this many drafts" and all it returns is the
tokens it verified.

One step in three parts (``LLMEngine.step``): ``Scheduler.schedule() -> StepPlan``,
``SpecRunner.run(plan) -> StepResult``, ``Scheduler.postprocess(plan, result)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trispec.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenAlternatives:
    """At one generated position: the most likely tokens, most likely first (ties: lower id first),
    and their log-probs under the distribution the token's own log-prob comes from. Tokens that
    distribution cannot produce (top-k / top-p cut them) are left out, so there may be fewer than
    asked for."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]


@dataclass(frozen=True)
class PromptLogProbs:
    """Log-probs of prompt tokens a step's feed scored: ``log_probs[i]`` is prompt token
    ``first + i``'s under the model's softmax at the position before it; ``top`` its alternatives."""

    first: int
    log_probs: list[float]
    top: list[TokenAlternatives] | None = None


@dataclass(frozen=True)
class Admitted:
    """What a sequence's caches hold of its verified tokens as it is admitted (their prefix caches)."""

    cached: int  # the target's: the scheduler feeds only the rest, always at least the last
    # the draft model's (0 without one): what drafting would not have to catch up on
    draft_cached: int = 0


@dataclass(frozen=True)
class SeqStep:
    """One sequence in one step.

    The runner's caches hold the first ``num_computed`` of ``token_ids`` (the sequence's verified
    tokens: prompt + output so far). This step feeds ``token_ids[num_computed:feed_to]``:

    * a prompt chunk (``feed_to < len(token_ids)``): fed and cached, nothing is drafted, verified or
      emitted (``num_draft_tokens`` is 0);
    * a decode step (``feed_to == len(token_ids)``): the rest of the prompt if any and the last
      verified token, then ``num_draft_tokens`` drafts (0: a plain step); the target verifies them
      and the step emits the accepted drafts plus one token of the target's.
    """

    seq_id: int
    token_ids: Sequence[int]
    num_computed: int
    feed_to: int
    num_draft_tokens: int
    sampling: SamplingParams

    @property
    def is_prompt_chunk(self) -> bool:
        return self.feed_to < len(self.token_ids)


@dataclass(frozen=True)
class StepPlan:
    steps: list[SeqStep] = field(default_factory=list)

    @property
    def decodes(self) -> list[SeqStep]:
        return [s for s in self.steps if not s.is_prompt_chunk]


@dataclass(frozen=True)
class SeqResult:
    seq_id: int
    # accepted drafts, then the target's own token; empty for a prompt chunk or on error
    new_token_ids: list[int] = field(default_factory=list)
    num_drafted: int = 0
    num_accepted: int = 0
    # how many of the sequence's tokens the runner's caches hold after the step (its one count of
    # them: the scheduler stores it as the sequence's ``num_computed``)
    num_computed: int = 0
    # set when this sequence failed on its own (alone, after its batch failed): it ends with it
    error: str | None = None
    # log-probability of each of ``new_token_ids`` (when the request asked for them)
    log_probs: list[float] | None = None
    # beside ``log_probs``, when the request asked for alternatives: one entry per new token
    top_log_probs: list[TokenAlternatives] | None = None
    # prompt tokens this step's feed scored, when the request asked for prompt log-probs
    prompt_log_probs: PromptLogProbs | None = None
    # a guided sequence the grammar ended: GRAMMAR_COMPLETE (satisfied, no end id to emit; after
    # ``new_token_ids``, which may be none), else why no token was allowed (a dead end, no token)
    grammar_end: str | None = None
    # positions in ``new_token_ids`` of end ids a guided sequence's grammar took as text there (where
    # it may not end): they do not end the request
    end_ids_as_text: tuple[int, ...] = ()


GRAMMAR_COMPLETE = "complete"


@dataclass(frozen=True)
class StepResult:
    results: dict[int, SeqResult] = field(default_factory=dict)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    # the batched round failed and was rerun one sequence at a time: its timing says nothing about
    # the batch size, so the adaptive controller does not learn from it
    isolated: bool = False
    # verified tokens a draft model fed to catch up (a sequence drafting for the first time, or after
    # plain rounds): that step's draft time is not a draft step's cost either
    draft_catch_up_tokens: int = 0
    # the drafter raised: every sequence of the step decoded plain
    draft_failed: bool = False


@dataclass(frozen=True)
class KVCacheMetrics:
    """One request's prompt in the target's KV pool, as TensorRT-LLM reports a request's
    ``RequestPerfMetrics.kv_cache_metrics``: its blocks found in the prefix cache (reused) and not
    (missed), the blocks taken from the pool for it (alloc total: the missed ones) and of those the
    ones that never held KV (alloc new; the rest evicted a cached block)."""

    reused_blocks: int
    missed_blocks: int
    alloc_new_blocks: int
    alloc_total_blocks: int
    # prompt tokens taken from the cache (OpenAI's cached_tokens); always fewer than the prompt's
    cached_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """reused / (reused + missed); 0 when nothing was reused (llmRequest.h
        ``getKVCacheHitRatePerRequest``)."""
        reused = self.reused_blocks
        return reused / (reused + self.missed_blocks) if reused else 0.0


@dataclass(frozen=True)
class KVUsage:
    """One KV pool's blocks (the target's, a draft model's): in use + cached + empty == total."""

    total_blocks: int
    used_blocks: int  # held by running sequences
    block_size: int
    # held by none but kept for reuse (the prefix cache); evicted when a block is needed
    cached_blocks: int = 0
    # prefix-cache totals since start: tokens sequences looked up, found cached; blocks evicted
    queried_tokens: int = 0
    hit_tokens: int = 0
    evicted_blocks: int = 0

    @property
    def free_blocks(self) -> int:
        """Blocks new tokens may take (empty or cached)."""
        return self.total_blocks - self.used_blocks

    @property
    def empty_blocks(self) -> int:
        return self.total_blocks - self.used_blocks - self.cached_blocks


@dataclass(frozen=True)
class PrefixCacheReset:
    """What emptying one KV pool's prefix cache did (``reset_prefix_cache``): the blocks no sequence
    held were emptied; the blocks running sequences hold stay theirs, unchanged, but no sequence
    admitted later finds them."""

    emptied_blocks: int
    held_blocks: int
