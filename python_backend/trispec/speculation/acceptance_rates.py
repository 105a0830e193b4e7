"""Acceptance per request: the conditional rate at which draft position j is accepted when the ones
before it were, from the request's own rounds, shrunk towards the rate over all requests."""

from __future__ import annotations

from dataclasses import dataclass, field


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


class AcceptanceRates:
    """The goodput controller's acceptance side (a part of ``GoodputController``): per request and
    draft position, shrunk towards all requests' with ``prior_strength`` rounds of weight
    (``prior_rate`` before any round)."""

    def __init__(self, prior_rate: float, prior_strength: float, plain_round_decay: float) -> None:
        self.prior_rate = prior_rate
        self.prior_strength = prior_strength
        self.plain_round_decay = plain_round_decay
        self._global = _Acceptance()
        self._requests: dict[int, _Acceptance] = {}

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

    def forget(self, seq_id: int) -> None:
        self._requests.pop(seq_id, None)
