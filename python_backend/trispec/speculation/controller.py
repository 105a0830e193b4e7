"""``GoodputController``: per step, each request's k from the online acceptance and cost estimates
(``choose_ks``), checked against what drafting delivered (``RealisedGoodput``)."""

from __future__ import annotations

from collections.abc import Sequence

from trispec.realised import RealisedGoodput
from trispec.speculation.acceptance_rates import AcceptanceRates
from trispec.speculation.cost_fit import CostFit
from trispec.speculation.exploration import Exploration, draft_at_cap
from trispec.speculation.plan import choose_ks, expected_tokens

# a drafting sequence's draft cache lacks at most its last verified token and last accepted draft
IN_STEP_LAG = 2


class GoodputController(AcceptanceRates, CostFit, Exploration):
    """Online acceptance and cost estimates feeding ``choose_ks`` (design and measurements:
    docs/design/adaptive-speculation.md).

    Warm-up: steps alternate between plain and drafting by one or two sequences until the cost model
    has seen both ``warmup_steps`` times; afterwards a few sequences explore now and then
    (``Exploration``). Drafting is chosen only where the model promises at least ``min_gain`` more
    tokens per second than plain; a sequence whose draft cache must catch up starts only where
    drafting would pay ``start_gain`` with every sequence paying such a catch-up
    (``_starts_that_pay``); and only at batch sizes where the model's drafting steps delivered
    (``realised``)."""

    def __init__(
        self,
        window: int = 64,
        warmup_steps: int = 6,
        explore_every: int = 256,
        max_explore_every: int = 8192,
        explore_budget: float = 0.01,
        explore_k: int = 2,
        explore_catch_up: float = 0.25,
        min_gain: float = 0.03,
        start_gain: float = 0.1,
        explore_margin: float = 0.1,
        hopeful_accept: float = 0.9,
        prior_rate: float = 0.6,
        prior_strength: float = 3.0,
        plain_round_decay: float = 0.8,
    ) -> None:
        AcceptanceRates.__init__(self, prior_rate, prior_strength, plain_round_decay)
        CostFit.__init__(self, window)
        Exploration.__init__(
            self,
            explore_every,
            max_explore_every,
            explore_budget,
            explore_k,
            explore_catch_up,
            explore_margin,
            hopeful_accept,
        )
        self.warmup_steps = warmup_steps
        self.min_gain = min_gain
        self.start_gain = start_gain
        self._decisions = 0
        self._drafted_steps = 0
        self._plain_steps = 0
        self.realised = RealisedGoodput()
        self._forced = False  # this step's drafting was warm-up or exploration, not the model's choice

    @property
    def warm(self) -> bool:
        """Past warm-up: both drafting and plain steps were measured ``warmup_steps`` times."""
        return self._drafted_steps >= self.warmup_steps and self._plain_steps >= self.warmup_steps

    # -- choice --------------------------------------------------------------------------------
    def choose(
        self,
        seq_ids: Sequence[int],
        max_ks: Sequence[int],
        lags: Sequence[int] | None = None,
        remaining: Sequence[int] | None = None,
        joining: int = 0,
    ) -> list[int]:
        """k per sequence. ``lags[i]``: tokens sequence i's draft cache lacks (what drafting now
        would first feed it); ``remaining[i]``: tokens it may still generate, over which that
        one-time catch-up is spread when weighing whether to start drafting; ``joining``: requests
        about to join the batch (prefilling, or queued with room to run)."""
        self._decisions += 1
        self._forced = False
        if not any(max_ks):
            return [0] * len(max_ks)
        if not self.warm:
            # drafting first, then plain, until both were seen often enough
            if self._drafted_steps > self._plain_steps:
                return [0] * len(max_ks)
            self._forced = True
            return draft_at_cap([0] * len(max_ks), max_ks, self._few(max_ks, lags, self._drafted_steps))
        if self.cost is None:
            self._forced = True
            return list(max_ks)
        glob = self._rates(self._global, None)
        accepts = [self.acceptance(i, glob) for i in seq_ids]
        start_s = None
        if lags is not None and remaining is not None and self.cost.catch_up_token_s > 0:
            start_s = [
                self.cost.catch_up_token_s * lag / max(1.0, left / expected_tokens(a, k))
                for lag, left, a, k in zip(lags, remaining, accepts, max_ks)
            ]
        ks = self._at_full_batch(accepts, max_ks, start_s, joining, glob)
        if (
            start_s is not None
            and lags is not None
            and any(k and lag > IN_STEP_LAG for k, lag in zip(ks, lags))
        ):
            # someone would start drafting: whether that pays is a steady-state question (while
            # nobody would, as through a plain stretch under load, the second choice is not needed)
            start_s = self._starts_that_pay(accepts, max_ks, lags, start_s, joining, glob)
            ks = self._at_full_batch(accepts, max_ks, start_s, joining, glob)
        if any(ks) and not self.realised.allows(len(ks), self._decisions):
            ks = [0] * len(ks)
        return self._explore_when_due(ks, max_ks, lags, accepts, self.cost)

    def _at_full_batch(
        self,
        accepts: list[list[float]],
        max_ks: Sequence[int],
        start_s: list[float] | None,
        joining: int,
        glob: list[float],
        gain: float | None = None,
        joining_start_s: float = 0.0,
    ) -> list[int]:
        """The step's ks, judged at the batch it is about to be: requests joining (prefilling, or
        queued with room) count as sequences of the global acceptance. Judged alone, a step that
        prefills newcomers beside a few decoding sequences looked like a small batch where drafting
        pays; but the draft passes delay the newcomers' prefill, and as soon as they decode the
        batch is where it may not (measured: 16 requests arriving at once on the 135M self-draft,
        the first decoding sequences drafted for 0.13 s in two ramp-up steps, and such runs came
        out 1.4 % slower than plain). ``gain``: the promise asked of drafting (``min_gain``);
        ``joining_start_s``: each joining request's catch-up share."""
        assert self.cost is not None
        gain = self.min_gain if gain is None else gain
        if not joining:
            return choose_ks(accepts, max_ks, self.cost, start_s, gain)
        cap = max(max_ks)
        full = choose_ks(
            accepts + [glob] * joining,
            [*max_ks, *[cap] * joining],
            self.cost,
            None if start_s is None else [*start_s, *[joining_start_s] * joining],
            gain,
        )
        return full[: len(max_ks)]

    def _starts_that_pay(
        self,
        accepts: list[list[float]],
        max_ks: Sequence[int],
        lags: Sequence[int],
        start_s: list[float],
        joining: int,
        glob: list[float],
    ) -> list[float]:
        """Whether to start: a sequence starts drafting only where drafting still pays, promising
        ``start_gain`` over plain (the model errs by about 10 % near break-even, measured on a 2-core
        CPU at two sequences), with every sequence bearing a catch-up share (its own, or the mean
        share of those starting); otherwise its whole catch-up counts, which keeps it plain. Judged
        one step at a time, each newcomer's catch-up looked paid for by passes its predecessors'
        had bought (docs/design/adaptive-speculation.md#starting-to-draft)."""
        assert self.cost is not None
        starting = {i for i, lag in enumerate(lags) if lag > IN_STEP_LAG and max_ks[i]}  # never empty:
        # the caller asks only when the step's choice starts someone
        typical = sum(start_s[i] for i in starting) / len(starting)
        shares = [s if i in starting else typical for i, s in enumerate(start_s)]
        steady = self._at_full_batch(
            accepts, max_ks, shares, joining, glob, gain=self.start_gain, joining_start_s=typical
        )
        return [
            self.cost.catch_up_token_s * lags[i] if i in starting and not steady[i] else s
            for i, s in enumerate(start_s)
        ]

    # -- measurements --------------------------------------------------------------------------
    def record_step(
        self,
        ks: Sequence[int],
        draft_s: float,
        verify_s: float | None,
        catch_up_tokens: int = 0,
        tokens: int | None = None,
    ) -> None:
        """A decode step's timing: ``verify_s`` only when every sequence fed just its pending token
        (None when prompt rows rode along, which say nothing about verify cost); ``catch_up_tokens``
        verified tokens the draft model fed before drafting (its cache catching up); ``tokens`` the
        step emitted (what the realised check weighs)."""
        forced, self._forced = self._forced, False
        if tokens is not None and not (forced and any(ks)):
            self._check_realised(ks, draft_s, verify_s, tokens)
        if any(ks):
            self._drafted_steps += 1
        elif verify_s is not None:
            self._plain_steps += 1
        self._record_timing(ks, draft_s, verify_s, catch_up_tokens)

    def _check_realised(self, ks: Sequence[int], draft_s: float, verify_s: float | None, tokens: int) -> None:
        """Feed the realised check. A drafting step that prefilled a prompt alongside still counts,
        with the model's verify time for its decode rows: a draft cache mostly catches up right
        after a request joins, which is when other prompts are prefilling, and leaving those steps
        out would leave out much of what drafting costs."""
        if verify_s is None:
            if not any(ks) or self.cost is None:
                return
            verify_s = self.cost.target_seconds(sum(k + 1 for k in ks))
        plain_s = self.cost.seconds([0] * len(ks)) if self.cost is not None else None
        self.realised.record(len(ks), any(ks), tokens, draft_s + verify_s, self._decisions, plain_s)
