"""Acceptance and timing statistics, per request and for the whole engine.

``mean_accepted_length`` is tokens emitted per verify round: 1 + accepted / rounds (every round
emits its accepted drafts plus one token from the target).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    rounds: int = 0
    # rounds that proposed at least one draft token
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    # accepted_per_position[i]: rounds in which draft position i (0-based) was accepted
    accepted_per_position: list[int] = field(default_factory=list)
    # drafted_per_position[i]: rounds that proposed a draft token at position i
    drafted_per_position: list[int] = field(default_factory=list)
    # rounds_by_num_draft_tokens[k]: rounds planned with k draft tokens (the adaptive controller's
    # choice, or the request's own k); a model-free drafter may then propose fewer
    rounds_by_num_draft_tokens: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0

    def record_round(self, num_drafted: int, num_accepted: int, num_planned: int | None = None) -> None:
        self.rounds += 1
        planned = num_drafted if num_planned is None else num_planned
        if len(self.rounds_by_num_draft_tokens) <= planned:
            self.rounds_by_num_draft_tokens.extend([0] * (planned + 1 - len(self.rounds_by_num_draft_tokens)))
        self.rounds_by_num_draft_tokens[planned] += 1
        self.drafts += num_drafted > 0
        self.draft_tokens += num_drafted
        self.accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_drafted:
            self.accepted_per_position.extend([0] * (num_drafted - len(self.accepted_per_position)))
            self.drafted_per_position.extend([0] * (num_drafted - len(self.drafted_per_position)))
        for i in range(num_drafted):
            self.drafted_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_num_draft_tokens(self) -> float:
        """The mean k planned per round."""
        total = sum(k * n for k, n in enumerate(self.rounds_by_num_draft_tokens))
        return total / self.rounds if self.rounds else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "rounds": self.rounds,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "accepted_per_position": list(self.accepted_per_position),
            "drafted_per_position": list(self.drafted_per_position),
            "mean_num_draft_tokens": round(self.mean_num_draft_tokens, 6),
            "rounds_by_num_draft_tokens": list(self.rounds_by_num_draft_tokens),
            "draft_time_s": round(self.draft_time_s, 6),
            "verify_time_s": round(self.verify_time_s, 6),
        }


@dataclass
class EngineStats(AcceptanceStats):
    """Totals over all requests, plus batching figures a server exports as metrics."""

    steps: int = 0
    requests_finished: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    # largest number of sequences that shared one verify forward pass
    max_verify_batch: int = 0
    verify_batches: int = 0
    verify_batch_sequences: int = 0
    # steps whose drafter raised (they ran as plain decoding)
    draft_failures: int = 0
    # sequences whose KV was freed because the pool ran out (recomputed later)
    preemptions: int = 0
    # prompt tokens of requests that got their first token, and of them those the target's prefix
    # cache held (not computed)
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    def record_verify_batch(self, num_sequences: int) -> None:
        self.verify_batches += 1
        self.verify_batch_sequences += num_sequences
        self.max_verify_batch = max(self.max_verify_batch, num_sequences)

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        out.update(
            steps=self.steps,
            requests_finished=self.requests_finished,
            generated_tokens=self.generated_tokens,
            prefill_tokens=self.prefill_tokens,
            draft_failures=self.draft_failures,
            preemptions=self.preemptions,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            max_verify_batch=self.max_verify_batch,
            mean_verify_batch=round(self.verify_batch_sequences / self.verify_batches, 3)
            if self.verify_batches
            else 0.0,
        )
        return out
