"""Did drafting deliver? Per batch size, the tokens per second of the steps the goodput model chose
to draft, against plain steps at the same size.

The model's promise can be wrong in ways it cannot see: a catch-up cost per token that varies with
the prompt, overheads outside the passes it times, acceptance a new request does not keep. Near
break-even such errors decide the sign, and speculation must never make serving slower than plain
decoding. So the model's choices are checked against what they delivered: where drafting at a batch
size measured slower than plain at that size, that size runs plain for ``hold`` decisions (doubling
each time the check fails again, up to ``max_hold``), and is then tried again.

Only steps the model chose count: warm-up and exploration steps draft for one or two sequences
whatever the model says. Catch-up steps count: what a draft cache costs to catch up is part of what
drafting costs, and a window of many steps spreads it as serving does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _BatchSize:
    drafted: deque[tuple[int, float]]  # (tokens, seconds) of the model's drafting steps
    plain: deque[float]  # seconds of plain steps
    hold_until: int = 0
    hold: int = 0  # the last hold's length; 0 while drafting here has not failed the check


@dataclass
class RealisedGoodput:
    window: int = 64  # drafting steps weighed at once (several requests' lifetimes and catch-ups)
    min_drafted: int = 32  # drafting steps before the first verdict
    min_plain: int = 8  # plain steps before their mean replaces the model's estimate
    hold: int = 256  # decisions a batch size first runs plain after drafting failed there
    max_hold: int = 8192
    _sizes: dict[int, _BatchSize] = field(default_factory=dict)

    def allows(self, batch: int, decision: int) -> bool:
        """Whether the model may draft at this batch size at this decision (counted by the caller)."""
        size = self._sizes.get(batch)
        return size is None or decision >= size.hold_until

    def record(
        self, batch: int, drafted: bool, tokens: int, seconds: float, decision: int, plain_s: float | None
    ) -> bool:
        """One decode step of ``batch`` sequences the model chose (``drafted``: any k > 0) that
        emitted ``tokens`` in ``seconds``. ``plain_s``: the model's estimate of a plain step at this
        size, used until enough plain steps were measured. Returns True when drafting here has just
        failed the check."""
        size = self._sizes.setdefault(batch, _BatchSize(deque(maxlen=self.window), deque(maxlen=self.window)))
        if not drafted:
            size.plain.append(seconds)
            return False
        size.drafted.append((tokens, seconds))
        if len(size.drafted) < self.min_drafted:
            return False
        if len(size.plain) >= self.min_plain:
            plain_s = sum(size.plain) / len(size.plain)
        if plain_s is None or plain_s <= 0:
            return False
        drafted_rate = sum(t for t, _ in size.drafted) / sum(s for _, s in size.drafted)
        if drafted_rate >= batch / plain_s:
            if len(size.drafted) == self.window:
                size.hold = 0  # a full window that delivered: a later failure starts from ``hold`` again
            return False
        size.hold = min(2 * size.hold, self.max_hold) if size.hold else self.hold
        size.hold_until = decision + size.hold
        size.drafted.clear()
        return True
