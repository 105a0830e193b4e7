"""Warm-up and exploration: which sequences draft while the cost model has not seen both drafting and
plain steps, and now and then afterwards whatever the model says, so that the draft cost and the
acceptance stay measured (docs/design/adaptive-speculation.md#warm-up-and-exploration)."""

from __future__ import annotations

from collections.abc import Sequence

from trispec.speculation.plan import StepCost, expected_tokens


class Exploration:
    """The goodput controller's exploration side (a part of ``GoodputController``): once every
    ``explore_every`` steps a few sequences draft ``explore_k`` tokens; the interval doubles, up to
    ``max_explore_every``, while the model chose plain all along, and falls back as soon as it drafts.
    Only where drafting could come near paying (``_could_pay``)."""

    # the controller's
    cost: StepCost | None
    _decisions: int
    _forced: bool

    def __init__(
        self,
        explore_every: int,
        max_explore_every: int,
        explore_budget: float,
        explore_k: int,
        explore_catch_up: float,
        explore_margin: float,
        hopeful_accept: float,
    ) -> None:
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.explore_budget = explore_budget
        self.explore_k = explore_k
        self.explore_catch_up = explore_catch_up
        self.explore_margin = explore_margin
        self.hopeful_accept = hopeful_accept
        self._explore_interval = explore_every
        self._next_explore = explore_every
        self._drafted_since_explore = False
        self._explorations = 0

    def _explore_when_due(
        self,
        ks: list[int],
        max_ks: Sequence[int],
        lags: Sequence[int] | None,
        accepts: Sequence[Sequence[float]],
        cost: StepCost,
    ) -> list[int]:
        """The step's ks, explored when the interval is up; the interval's bookkeeping."""
        if any(ks):  # drafting pays again: explore at the base rate from now on
            self._drafted_since_explore = True
            self._explore_interval = self.explore_every
            self._next_explore = min(self._next_explore, self._decisions + self.explore_every)
        if self._decisions >= self._next_explore:
            if not self._drafted_since_explore:
                self._explore_interval = min(2 * self._explore_interval, self.max_explore_every)
            self._next_explore = self._decisions + self._explore_interval
            self._drafted_since_explore = False
            if any(ks) or self._could_pay(accepts, max_ks, cost):
                ks = self._explore(ks, max_ks, lags)
        return ks

    def _could_pay(self, accepts: Sequence[Sequence[float]], max_ks: Sequence[int], cost: StepCost) -> bool:
        """Whether drafting could come near paying here: the best plan drafting the same k for all,
        with every acceptance at least ``hopeful_accept``, within ``explore_margin`` of plain. Where
        even that loses clearly (a compute-bound verify pass under load), the cost of drafting is
        what decides, and measuring it again costs a draft catch-up for nothing."""
        hopeful = [[max(a, self.hopeful_accept) for a in rates] for rates in accepts]
        n = len(max_ks)
        plain = n / cost.seconds([0] * n)
        for k in range(1, max(max_ks) + 1):
            plan = [min(k, m) for m in max_ks]
            tokens = sum(expected_tokens(h, j) for h, j in zip(hopeful, plan))
            if tokens / cost.seconds(plan) >= (1 - self.explore_margin) * plain:
                return True
        return False

    def _explore(self, ks: list[int], max_ks: Sequence[int], lags: Sequence[int] | None) -> list[int]:
        """One or two sequences (rotating over the batch, those whose draft cache lags least first)
        draft at most ``explore_k`` tokens whatever the model says; only those whose catch-up costs
        at most ``explore_catch_up`` of a plain step, and none when their catch-ups would cost more
        than ``explore_budget`` of the time until the next exploration. Measured at the cap of 4: one
        cost 1.5-3 plain steps (docs/design/adaptive-speculation.md#warm-up-and-exploration)."""
        n = len(ks)
        if lags is None or self.cost is None:
            order = self._few(max_ks, lags, self._explorations)
        else:
            # not measured yet: a draft model's catch-up token costs about what a target row does
            per_token_s = self.cost.catch_up_token_s or self.cost.target_row_s
            plain_step_s = self.cost.seconds([0] * n)
            cheap = [i for i in range(n) if per_token_s * lags[i] <= self.explore_catch_up * plain_step_s]
            order = self._few(max_ks, lags, self._explorations, cheap)
            budget_s = self.explore_budget * self._explore_interval * plain_step_s
            if not order or per_token_s * sum(lags[i] for i in order) > budget_s:
                return ks
        self._explorations += 1
        self._forced = True
        return draft_at_cap(ks, [min(m, self.explore_k) for m in max_ks], order)

    @staticmethod
    def _few(
        max_ks: Sequence[int], lags: Sequence[int] | None, turn: int, able: Sequence[int] | None = None
    ) -> list[int]:
        """One or two sequences that may draft (alternately, so that drafted positions vary against
        draft passes), those whose draft cache lags least first, rotating over the batch."""
        n = len(max_ks)
        able = [i for i in (range(n) if able is None else able) if max_ks[i] > 0]
        order = sorted(able, key=lambda i: (lags[i] if lags is not None else 0, (i - turn) % n))
        return order[: 1 + turn % 2]


def draft_at_cap(ks: list[int], max_ks: Sequence[int], chosen: Sequence[int]) -> list[int]:
    """The ``chosen`` sequences draft at least ``max_ks[i]`` (``ks`` changed in place)."""
    for i in chosen:
        ks[i] = max(ks[i], max_ks[i])
    return ks
