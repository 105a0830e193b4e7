"""How many tokens to draft, per request and per step: the measured goodput choice.

Drafting k tokens for a request costs k draft positions (shared draft passes) and k more rows in the
target's verify pass; it pays back the drafts the target accepts. Whether that wins depends on the
request (code copies more than chat), the batch (a CPU's verify pass turns compute-bound as rows
grow, the reason peers get slower than plain decoding under load) and the drafter (a model or a
free n-gram lookup). So both sides are measured while serving:

* acceptance, per request: the conditional rate at which draft position j is accepted when the
  ones before it were, from the request's own rounds, shrunk towards the rate over all requests;
* cost, per step: a model of the step's time from what it did, fitted over the last steps. A
  forward pass (the target's verify pass over rows = sum of k + 1; each draft pass over the
  sequences drafting that position) costs a fixed part until its rows make it compute-bound and a
  part per row past that knee: ``base + per_row x max(0, rows - knee)``. A straight line through
  such a curve overstates small passes and understates large ones, which made drafting look cheap
  exactly where a CPU's verify pass turns compute-bound; the knee is fitted too (the best of a few
  candidates). A draft model's cache also catches up on tokens it missed (``e`` per token). Draft
  caches fill lazily, so a request that starts drafting late first pays e x its lag; that one-off
  is spread over the tokens it has left when weighing whether to start.

``choose_ks`` (pure, testable with hand-made tables) picks each request's k to maximise expected
tokens per second of the step; k = 0 everywhere when drafting does not pay. The choice changes speed
only: the output is the target's either way.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trispec.realised import RealisedGoodput

MAX_KNEES = 12  # candidate knees per fit: the fit runs every few steps
# a drafting sequence's draft cache lacks at most its last verified token and last accepted draft
IN_STEP_LAG = 2


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


@dataclass
class _Acceptance:
    """Per draft position: rounds that tested it (all earlier drafts accepted) and accepted it."""

    tested: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def record(self, drafted: int, accepted: int, decay: float = 1.0) -> None:
        tested_positions = min(accepted + 1, drafted)
        while len(self.tested) < tested_positions:
            self.tested.append(0.0)
            self.accepted.append(0.0)
        if decay < 1.0:
            self.age(decay)
        for j in range(tested_positions):
            self.tested[j] += 1
            self.accepted[j] += j < accepted

    def age(self, decay: float) -> None:
        self.tested = [t * decay for t in self.tested]
        self.accepted = [a * decay for a in self.accepted]


class GoodputController:
    """Online acceptance and cost estimates feeding ``choose_ks``.

    Warm-up: until the cost model has seen both drafting and plain steps, steps alternate between
    plain and drafting by one or two sequences (those whose draft cache lags least): a draft model
    first catches up on every prompt it drafts for, so warming up with the whole batch costs a
    draft prefill of every prompt in it. Afterwards, once every ``explore_every`` steps, a few
    sequences draft ``explore_k`` tokens whatever the model says, so that the draft cost and
    acceptance stay measured
    while the model prefers plain. Such a step costs (a draft cache catches up), so the interval
    doubles, up to ``max_explore_every``, each time the model chose plain all along since the last
    one, and falls back to ``explore_every`` as soon as the model drafts on its own. Only where
    drafting could come near paying (``_could_pay``: within ``explore_margin`` of plain even with
    acceptance as high as ``hopeful_accept``): far from it, the cost side decides and is measured.

    Drafting is chosen only where the model promises at least ``min_gain`` more tokens per second
    than plain: near break-even its errors decide the sign, and a loss there is what users of other
    stacks see under load. A sequence whose draft cache must catch up starts drafting only where
    drafting would pay ``start_gain`` with every sequence paying such a catch-up
    (``_starts_that_pay``). And only at batch sizes where the model's drafting steps delivered
    (``realised``): where they measured slower than plain steps of the same size, that size runs
    plain for a while whatever the model promises.
    """

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
        self.window = window
        self.warmup_steps = warmup_steps
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.explore_budget = explore_budget
        self.explore_k = explore_k
        self.explore_catch_up = explore_catch_up
        self.min_gain = min_gain
        self.start_gain = start_gain
        self.explore_margin = explore_margin
        self.hopeful_accept = hopeful_accept
        self._explore_interval = explore_every
        self._next_explore = explore_every
        self._drafted_since_explore = False
        self._explorations = 0
        self.prior_rate = prior_rate
        self.prior_strength = prior_strength
        self.plain_round_decay = plain_round_decay
        # the last ``window`` samples of each shape: (rows) -> verify seconds, (sequences in each draft
        # pass) -> draft seconds, and catch-up steps. Kept per shape, because a batch that runs
        # plain for a long while repeats one shape; a plain sliding window would then forget what
        # more rows cost, and the fit could no longer tell a pass's fixed cost from a row's
        self._verify_samples: dict[int, deque[float]] = {}
        self._draft_samples: dict[tuple[int, ...], deque[float]] = {}
        self._catch_up_samples: deque[tuple[tuple[int, ...], int, float]] = deque(maxlen=window)
        self._global = _Acceptance()
        self._requests: dict[int, _Acceptance] = {}
        self._decisions = 0
        self._drafted_steps = 0
        self._plain_steps = 0
        self.cost: StepCost | None = None
        # refitting is the controller's main cost (about a millisecond): a shape not seen before is
        # news (the model may have been extrapolating there), more samples of known shapes only
        # move their medians
        self.refit_new_shape_every = 4
        self.refit_every = 16
        self._samples = 0
        self._new_shape = False
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
            return _draft_at_cap([0] * len(max_ks), max_ks, self._few(max_ks, lags, self._drafted_steps))
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
        if any(ks):  # drafting pays again: explore at the base rate from now on
            self._drafted_since_explore = True
            self._explore_interval = self.explore_every
            self._next_explore = min(self._next_explore, self._decisions + self.explore_every)
        if self._decisions >= self._next_explore:
            if not self._drafted_since_explore:
                self._explore_interval = min(2 * self._explore_interval, self.max_explore_every)
            self._next_explore = self._decisions + self._explore_interval
            self._drafted_since_explore = False
            if any(ks) or self._could_pay(accepts, max_ks, self.cost):
                ks = self._explore(ks, max_ks, lags)
        return ks

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
        """Spreading a catch-up over the rest of a request is right once it drafts; whether to start
        is a question about the steady state. The sequences whose draft passes it would share leave,
        and those taking their place (and any about to join) catch up too: judged one step at a
        time, each newcomer's catch-up looked paid for by passes its predecessors' catch-ups had
        bought (measured: every request of a two-request closed loop on long prompts caught up,
        and drafting lost to plain). So a sequence starts only where drafting still pays with every
        sequence bearing a catch-up share: its own, or, for one already in step or about to join,
        the mean share of those starting, and promising ``start_gain`` over plain: a catch-up is
        spent at once, and the model's error near break-even (about 10 % measured on a 2-core CPU
        at two sequences) would decide the sign. Otherwise its whole catch-up counts, which keeps
        it plain."""
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
        """One or two sequences (in turn, rotating over the batch; those whose draft cache lags
        least first) draft ``explore_k`` tokens whatever the model says: enough to keep the draft
        cost and the acceptance measured, and to vary sequences against draft passes. Rarely, few
        and short, because an exploration lands in some request's run whole: a draft model that
        sat out plain rounds first catches up on what it missed, so only sequences whose catch-up
        costs at most ``explore_catch_up`` of a plain step take part, and draft at most two positions
        (two draft passes, not k): at the cap of 4 with a catch-up of up to a plain step, one
        exploration cost 1.5-3 plain steps, 2-4 % of a 64-token run at 16 requests. (One position
        only was cheaper still, but then the verify pass was measured at too few sizes to see
        soon enough that drafting pays again after the target's cost changed.) When their catch-ups
        together would cost more than ``explore_budget`` of the time until the next exploration,
        this one is skipped (the interval keeps growing, so a later one fits)."""
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
        return _draft_at_cap(ks, [min(m, self.explore_k) for m in max_ks], order)

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

    def acceptance(self, seq_id: int, glob: list[float] | None = None) -> list[float]:
        """The request's conditional acceptance per position, shrunk towards all requests' (``glob``,
        when the caller already has it)."""
        if glob is None:
            glob = self._rates(self._global, None)
        own = self._requests.get(seq_id)
        return self._rates(own, glob) if own is not None else glob

    def _rates(self, stats: _Acceptance | None, prior: list[float] | None) -> list[float]:
        positions = max(len(stats.tested) if stats else 0, len(prior) if prior else 0, 1)
        rates = []
        for j in range(positions):
            p = prior[min(j, len(prior) - 1)] if prior else self.prior_rate
            tested = stats.tested[j] if stats and j < len(stats.tested) else 0.0
            accepted = stats.accepted[j] if stats and j < len(stats.accepted) else 0.0
            rates.append((accepted + self.prior_strength * p) / (tested + self.prior_strength))
        return rates

    # -- measurements --------------------------------------------------------------------------
    def record_round(self, seq_id: int, drafted: int, accepted: int) -> None:
        if drafted:
            self._requests.setdefault(seq_id, _Acceptance()).record(drafted, accepted)
            self._global.record(drafted, accepted, decay=0.995)  # follows drift in the mix
        elif (own := self._requests.get(seq_id)) is not None:
            # a request put at k = 0 by its own rates is never measured again: one unlucky early
            # round kept it plain for life, at a drafting batch's step time (2.4x a plain step on
            # the 135M self-draft at 8 requests), and a closed loop waited on it. Evidence not
            # renewed fades back towards the global rate, so such a request is tried again soon,
            # while a long record of rejections still keeps it plain for a while
            own.age(self.plain_round_decay)

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
            if catch_up_tokens:
                self._catch_up_samples.append((tuple(draft_passes(ks)), catch_up_tokens, draft_s))
            else:
                self._sample(self._draft_samples, tuple(draft_passes(ks)), draft_s)
        elif verify_s is not None:
            self._plain_steps += 1
        if verify_s is not None:
            self._sample(self._verify_samples, sum(k + 1 for k in ks), verify_s)
        self._samples += 1
        if (
            self.cost is None
            or self._samples % self.refit_every == 0
            or (self._new_shape and self._samples % self.refit_new_shape_every == 0)
        ):
            self.cost = self._fit()
            self._new_shape = False

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

    def _sample(self, samples: dict[Any, deque[float]], shape: Any, seconds: float) -> None:
        if shape not in samples:
            samples[shape] = deque(maxlen=self.window)
            self._new_shape = True
        samples[shape].append(seconds)

    def forget(self, seq_id: int) -> None:
        self._requests.pop(seq_id, None)

    def _fit(self) -> StepCost | None:
        """The cost model from the samples: each shape's mean weighted by how often it was seen (the
        mean, not the median: a drafter that is sometimes free and sometimes not, suffix decoding
        before a model, costs its expectation); per pass, the knee that fits best."""
        verify = [(rows, float(np.mean(t)), len(t)) for rows, t in self._verify_samples.items()]
        if sum(n for _, _, n in verify) < 4:
            return None
        rows, verify_s, weight = np.array(verify, dtype=np.float64).T
        (a, b), target_knee = _fit_knee(
            lambda knee: np.column_stack([np.ones_like(rows), np.maximum(rows - knee, 0)]),
            verify_s,
            weight,
            rows,
        )
        c, d, e, draft_knee = self._fit_draft()
        return StepCost(a, b, c, d, e, target_knee, draft_knee)

    def _fit_draft(self) -> tuple[float, float, float, int]:
        """(per pass, per sequence past the knee, per catch-up token, knee). The passes are fitted on
        steps without a catch-up alone: a few long catch-ups, whose cost per token is itself
        estimated, would otherwise decide what a second sequence in a pass costs. The catch-up
        cost then comes from what those steps took beyond their passes."""
        plain = [(shape, float(np.mean(t)), len(t)) for shape, t in self._draft_samples.items()]
        catch_up = list(self._catch_up_samples)
        if not plain and not catch_up:
            return 0.0, 0.0, 0.0, 0
        if not plain:  # right after warm-up every drafted step caught up: passes and tokens jointly
            x = np.array([[len(shape), tokens] for shape, tokens, _ in catch_up], dtype=np.float64)
            (c, e), _ = _nonneg_lstsq(x, np.array([t for _, _, t in catch_up]))
            return c, 0.0, e, 0
        shapes = _padded([shape for shape, _, _ in plain])
        passes = (shapes > 0).sum(axis=1).astype(np.float64)
        (c, d), knee = _fit_knee(
            lambda knee: np.column_stack([passes, np.maximum(shapes - knee, 0).sum(axis=1)]),
            np.array([t for _, t, _ in plain]),
            np.array([n for _, _, n in plain], dtype=np.float64),
            shapes[shapes > 0],
        )
        e = 0.0
        if catch_up:
            cost = StepCost(0.0, 0.0, c, d, draft_knee=knee)
            tokens = np.array([tokens for _, tokens, _ in catch_up], dtype=np.float64)
            beyond = np.array([t - sum(map(cost.draft_pass_seconds, shape)) for shape, _, t in catch_up])
            (e,), _ = _nonneg_lstsq(tokens[:, None], beyond)
        return c, d, e, knee


def _draft_at_cap(ks: list[int], max_ks: Sequence[int], chosen: Sequence[int]) -> list[int]:
    for i in chosen:
        ks[i] = max(ks[i], max_ks[i])
    return ks


def _padded(shapes: Sequence[tuple[int, ...]]) -> np.ndarray:
    """Sequences per draft pass, one row per step, zero-padded to the longest."""
    out = np.zeros((len(shapes), max(len(shape) for shape in shapes)), dtype=np.float64)
    for i, shape in enumerate(shapes):
        out[i, : len(shape)] = shape
    return out


def _fit_knee(
    columns: Callable[[int], np.ndarray], y: np.ndarray, weight: np.ndarray, sizes: np.ndarray
) -> tuple[tuple[float, ...], int]:
    """Weighted non-negative least squares of ``y`` on ``columns(knee)`` for each candidate knee (0
    and the pass sizes seen, at most ``MAX_KNEES`` of them): the best fit and its knee. Ties keep
    the smaller knee."""
    seen = np.unique(sizes[sizes > 0]).astype(int)
    if len(seen) > MAX_KNEES:
        seen = seen[np.linspace(0, len(seen) - 1, MAX_KNEES).round().astype(int)]
    root = np.sqrt(weight)[:, None]
    tolerance = 1e-9 * float(np.sum(weight * y**2))  # fits equal up to rounding: the smaller knee
    best: tuple[float, tuple[float, ...], int] | None = None
    for knee in [0, *seen.tolist()]:
        x = columns(knee)
        coef, residual = _nonneg_lstsq(x * root, y * root[:, 0])
        if best is None or residual < best[0] - tolerance:
            best = (residual, coef, knee)
    assert best is not None
    return best[1], best[2]


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[tuple[float, ...], float]:
    """Non-negative least squares for a handful of columns: the best fit over every subset of the
    columns whose own least-squares coefficients are all non-negative (the others held at 0). A
    column the data cannot tell apart from the rest gets 0 rather than an arbitrary split. Returns
    the coefficients and the residual sum of squares."""
    n = x.shape[1]
    best: tuple[float, tuple[float, ...]] = (float(np.sum(y**2)), (0.0,) * n)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            columns = x[:, subset]
            coef, _, rank, _ = np.linalg.lstsq(columns, y, rcond=None)
            if rank < size or np.any(coef < 0):
                continue
            residual = float(np.sum((y - columns @ coef) ** 2))
            if residual < best[0] * (1 - 1e-9):
                full = [0.0] * n
                for j, value in zip(subset, coef):
                    full[j] = float(value)
                best = (residual, tuple(full))
    return best[1], best[0]
