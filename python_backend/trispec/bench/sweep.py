"""One point of the sweep: every arm's runs, repeated in alternating order."""

from __future__ import annotations

from collections.abc import Callable

from trispec.bench.arms import Arm
from trispec.bench.closed_loop import LoopResult

MAX_REPEATS = 16


def run_point(
    arms: list[Arm],
    run: Callable[[Arm], LoopResult],
    repeats: int,
    min_seconds: float = 0.0,
    on_extra_repeat: Callable[[], None] = lambda: None,
) -> dict[str, list[LoopResult]]:
    """Every arm's runs at one point: ``repeats`` rounds, then more (in pairs, up to MAX_REPEATS)
    until every arm has run ``min_seconds`` in all. Rounds alternate the arms' order (A B, B A, ...),
    so that drift on a noisy machine spreads evenly over them; a short point thus gets more rounds
    than a long one, where one run already averages over a long time."""
    runs: dict[str, list[LoopResult]] = {arm.name: [] for arm in arms}

    def one_round() -> None:
        order = arms if len(runs[arms[0].name]) % 2 == 0 else arms[::-1]
        for arm in order:
            runs[arm.name].append(run(arm))

    def short() -> bool:
        return min(sum(r.elapsed_s for r in done) for done in runs.values()) < min_seconds

    for _ in range(repeats):
        one_round()
    while short() and len(runs[arms[0].name]) + 2 <= MAX_REPEATS:
        for _ in range(2):  # a pair keeps both orders equally often
            on_extra_repeat()
            one_round()
    return runs
