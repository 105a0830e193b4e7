"""The pure choice of k: each request's k that maximises the step's expected tokens per second,
from per-position acceptance rates and a ``StepCost`` model (testable with hand-made tables).
k = 0 everywhere when drafting does not pay; the choice changes speed only, never the output
(docs/design/adaptive-speculation.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step as a function of its plan."""

    target_base_s: float  # a verify pass up to ``target_knee`` rows (weights read once per pass)
    target_row_s: float  # per verified row (k + 1 per sequence) past the knee
    draft_pass_s: float = 0.0  # per draft position (one batched draft forward)
    draft_seq_s: float = 0.0  # per sequence in a draft pass, past ``draft_knee`` sequences
    # per verified token a draft model's cache feeds before drafting (once per catch-up, so not
    # part of ``seconds``: the caller spreads it over the rounds it enables)
    catch_up_token_s: float = 0.0
    target_knee: int = 0
    draft_knee: int = 0

    def target_seconds(self, rows: int) -> float:
        return self.target_base_s + self.target_row_s * max(0, rows - self.target_knee)

    def draft_pass_seconds(self, sequences: int) -> float:
        """One draft pass over ``sequences`` sequences (0: no pass)."""
        if sequences <= 0:
            return 0.0
        return self.draft_pass_s + self.draft_seq_s * max(0, sequences - self.draft_knee)

    def seconds(self, ks: Sequence[int]) -> float:
        return self.target_seconds(sum(k + 1 for k in ks)) + sum(
            self.draft_pass_seconds(n) for n in draft_passes(ks)
        )


def draft_passes(ks: Sequence[int]) -> list[int]:
    """Sequences in each draft pass: pass j drafts position j for every sequence with k > j."""
    return [sum(k > j for k in ks) for j in range(max(ks, default=0))]


def expected_tokens(accept: Sequence[float], k: int) -> float:
    """Tokens a round emits with k drafts: 1 + sum over j < k of P(drafts 0..j all accepted), where
    ``accept[j]`` is P(draft j accepted | drafts before it accepted) (the last value repeats)."""
    total, p = 1.0, 1.0
    for j in range(k):
        p *= accept[min(j, len(accept) - 1)] if accept else 0.0
        total += p
    return total


def choose_ks(
    accepts: Sequence[Sequence[float]],
    max_ks: Sequence[int],
    cost: StepCost,
    start_s: Sequence[float] | None = None,
    min_gain: float = 0.0,
) -> list[int]:
    """Each sequence's k in [0, max_k] maximising (sum of expected tokens) / (step seconds).

    ``start_s[i]``: seconds added to the step if sequence i drafts at all (its share of a draft
    cache catching up; 0 when there is none). ``min_gain``: drafting must promise at least this
    fraction more tokens per second than plain decoding of the whole step, else k = 0 everywhere
    (the model's estimates err: where the promise is thin, plain is the safe side).

    Coordinate ascent: each sequence in turn takes the k that is best given the others', until
    nothing changes (a few passes; ties keep the smaller k). The step's cost is updated
    incrementally, so a pass is O(sequences x max k)."""
    n = len(max_ks)
    if n == 0:
        return []
    start = list(start_s) if start_s is not None else [0.0] * n
    gains = [[expected_tokens(accepts[i], k) for k in range(max_ks[i] + 1)] for i in range(n)]

    def seconds(plan: Sequence[int]) -> float:
        return cost.seconds(plan) + sum(s for s, k in zip(start, plan) if k)

    # the draft passes are shared, so drafting for one sequence alone can lose where drafting for all
    # wins: start from the best uniform plan (every sequence at the same k, capped by its max)
    starts = [[min(k, m) for m in max_ks] for k in range(max(max_ks) + 1)]
    ks = max(starts, key=lambda plan: sum(g[k] for g, k in zip(gains, plan)) / seconds(plan))
    passes = draft_passes(ks) + [0] * (max(max_ks) - max(ks))  # sequences per draft position
    tokens = sum(g[k] for g, k in zip(gains, ks))
    rows = sum(k + 1 for k in ks)
    extra = sum(s for s, k in zip(start, ks) if k)
    best = tokens / seconds(ks)
    for _ in range(4):
        changed = False
        for i in range(n):
            current = ks[i]
            for j in range(current):
                passes[j] -= 1
            base_tokens = tokens - gains[i][current]
            base_rows = rows - current - 1
            base_extra = extra - (start[i] if current else 0.0)
            draft_s = sum(cost.draft_pass_seconds(m) for m in passes)  # the others' passes
            choice, choice_value = current, best
            for k in range(max_ks[i] + 1):
                if k:  # this sequence joins pass k - 1
                    draft_s += cost.draft_pass_seconds(passes[k - 1] + 1) - cost.draft_pass_seconds(
                        passes[k - 1]
                    )
                step_s = (
                    cost.target_seconds(base_rows + k + 1) + draft_s + base_extra + (start[i] if k else 0.0)
                )
                value = (base_tokens + gains[i][k]) / step_s
                if value > choice_value * (1 + 1e-9) or (k < choice and value >= choice_value):
                    choice, choice_value = k, value
            for j in range(choice):
                passes[j] += 1
            if choice != current:
                ks[i] = choice
                tokens, rows = base_tokens + gains[i][choice], base_rows + choice + 1
                extra = base_extra + (start[i] if choice else 0.0)
                best, changed = choice_value, True
        if not changed:
            break
    if any(ks) and best < (1 + min_gain) * n / seconds([0] * n):
        return [0] * n
    return ks
