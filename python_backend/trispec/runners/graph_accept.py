"""A graph round's acceptance, on the host from its one copy: each sequence keeps its drafts while they
equal the target's token for their row, then the target's token; a row whose kept set did not fit
the device's width (token -1) ends the sequence's tokens at the row before, and at its first row sends
the sequence's round to the eager path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trispec.runners.graph_plan import GraphPlan
from trispec.step import SeqStep


@dataclass(frozen=True)
class Accepted:
    tokens: list[int]  # the accepted drafts, then the target's token
    num_drafted: int
    num_accepted: int
    log_probs: list[float] | None


def accept_rows(
    steps: Sequence[SeqStep],
    plan: GraphPlan,
    rows: list[list[int]],
    log_probs: list[list[float]] | None,
    max_k: int,
) -> tuple[dict[int, Accepted], list[SeqStep]]:
    """``rows[i]``: sequence i's drafts in ``[0, max_k)``, the target's tokens in ``[max_k, 2 max_k + 1)``;
    ``log_probs[i]`` those tokens' log-probabilities. Returns what each sequence keeps, and the
    sequences to run eagerly."""
    kept: dict[int, Accepted] = {}
    eager = []
    for i, (s, k, row) in enumerate(zip(steps, plan.ks, rows)):
        proposal = plan.proposals[i]
        drafts = list(proposal) if proposal is not None else row[:k]
        targets = row[max_k : max_k + k + 1]
        n = next((j for j in range(k) if drafts[j] != targets[j]), k)
        if targets[n] < 0:  # that row's kept set did not fit: emit up to the row before
            if n == 0:
                eager.append(s)
                continue
            n -= 1
        lp = log_probs[i][: n + 1] if log_probs is not None and s.sampling.return_log_probs else None
        kept[s.seq_id] = Accepted([*drafts[:n], targets[n]], k, n, lp)
    return kept, eager
