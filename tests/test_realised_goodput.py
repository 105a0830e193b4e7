"""The realised check: drafting at a batch size that measured slower than plain steps there runs
plain for a while, then is tried again."""

from __future__ import annotations

from trispec.realised import RealisedGoodput

PLAIN_S = 0.020  # a plain step at batch 2: 100 tokens/s


def feed(
    check: RealisedGoodput, batch: int, tokens: int, seconds: float, steps: int, start: int
) -> list[bool]:
    return [check.record(batch, True, tokens, seconds, start + i, PLAIN_S) for i in range(steps)]


def test_drafting_slower_than_plain_is_held_off_at_that_batch_size_only() -> None:
    check = RealisedGoodput(window=8, min_drafted=4, hold=10, max_hold=40)
    # 5 tokens in 0.060 s: 83 tokens/s against plain's 100
    verdicts = feed(check, 2, 5, 0.060, 4, start=0)
    assert verdicts == [False, False, False, True]  # no verdict before 4 drafting steps
    assert not check.allows(2, 3) and not check.allows(2, 12)
    assert check.allows(2, 13)  # held for 10 decisions, then tried again
    assert check.allows(1, 5) and check.allows(4, 5)  # other batch sizes are not affected
    # failing again doubles the hold, up to max_hold
    assert feed(check, 2, 5, 0.060, 4, start=20)[-1]
    assert not check.allows(2, 42) and check.allows(2, 43)
    for start in (50, 100, 200):
        feed(check, 2, 5, 0.060, 4, start=start)
    assert check.allows(2, 203 + 40) and not check.allows(2, 203 + 39)


def test_drafting_that_delivers_is_kept_and_a_full_window_resets_the_hold() -> None:
    check = RealisedGoodput(window=8, min_drafted=4, hold=10, max_hold=40)
    assert feed(check, 2, 5, 0.060, 4, start=0)[-1]  # held once: the next hold would be 20
    assert not any(feed(check, 2, 5, 0.040, 8, start=20))  # 125 tokens/s: delivers
    assert check.allows(2, 30)
    # slower again: the sliding window turns once fewer than half of its steps are the quick ones
    verdicts = feed(check, 2, 5, 0.060, 8, start=30)
    failed_at = 30 + verdicts.index(True)
    assert failed_at == 34
    assert not check.allows(2, failed_at + 9) and check.allows(2, failed_at + 10)  # the first hold again


def test_measured_plain_steps_replace_the_estimate() -> None:
    check = RealisedGoodput(window=8, min_drafted=4, min_plain=4, hold=10)
    # the estimate says plain makes 100 tokens/s, but plain steps measured 0.040 s: 50 tokens/s
    for i in range(4):
        check.record(2, False, 2, 0.040, i, PLAIN_S)
    assert not any(feed(check, 2, 5, 0.060, 8, start=4))  # 83 tokens/s beats the measured plain


def test_the_mean_over_a_window_weighs_a_costly_catch_up_step() -> None:
    check = RealisedGoodput(window=8, min_drafted=8, hold=10)
    # seven quick drafting steps (5 tokens in 0.030 s) and one that caught up a long prompt (0.5 s)
    verdicts = [*feed(check, 2, 5, 0.030, 7, start=0), check.record(2, True, 5, 0.5, 7, PLAIN_S)]
    assert verdicts[-1]  # 40 tokens in 0.71 s: 56 tokens/s, slower than plain
