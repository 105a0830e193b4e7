"""When to speculate: measured, per batch size.

Drafting pays off when the target is memory-bound (small batches) and loses when the verify pass
turns compute-bound (large batches) — the reason peers get slower than plain decoding under load.
``SpeculationController`` keeps, per batch-size bucket, a moving average of the throughput each arm
actually delivered (tokens emitted per second of step time) and picks the better arm, trying the
other now and then (less often when it lost by far) so a change (acceptance drifting, load
shifting) is noticed. The choice only
changes speed: the output is the target's either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def batch_bucket(batch_size: int) -> int:
    """Powers of two: 1, 2-3, 4-7, 8-15, ..."""
    return max(batch_size, 1).bit_length() - 1


@dataclass
class _Arm:
    throughput: float = 0.0  # exponential moving average, tokens per second
    samples: int = 0


@dataclass
class _Bucket:
    arms: dict[bool, _Arm] = field(default_factory=lambda: {True: _Arm(), False: _Arm()})
    steps: int = 0


class SpeculationController:
    """Two arms per bucket: speculate (requested k) or plain (k = 0 for this step)."""

    def __init__(self, warmup_steps: int = 3, explore_every: int = 16, smoothing: float = 0.2) -> None:
        self.warmup_steps = warmup_steps  # samples of each arm before trusting the averages
        self.explore_every = explore_every
        self.smoothing = smoothing
        self._buckets: dict[int, _Bucket] = {}

    def choose(self, batch_size: int) -> bool:
        """True: draft this step; False: plain decoding for this step."""
        bucket = self._buckets.setdefault(batch_bucket(batch_size), _Bucket())
        bucket.steps += 1
        spec, plain = bucket.arms[True], bucket.arms[False]
        # warm up both arms, speculation first
        if spec.samples < self.warmup_steps:
            return True
        if plain.samples < self.warmup_steps:
            return False
        best = spec.throughput >= plain.throughput
        # re-try the other arm now and then; rarely when it lost clearly (each try costs a slow step)
        high, low = max(spec.throughput, plain.throughput), min(spec.throughput, plain.throughput)
        interval = self.explore_every * (4 if high > 1.5 * low else 1)
        if bucket.steps % interval == 0:
            return not best
        return best

    def record(self, batch_size: int, speculated: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        arm = self._buckets.setdefault(batch_bucket(batch_size), _Bucket()).arms[speculated]
        rate = tokens / seconds
        arm.throughput = (
            rate if arm.samples == 0 else arm.throughput + self.smoothing * (rate - arm.throughput)
        )
        arm.samples += 1

    def snapshot(self) -> dict[int, dict[str, float]]:
        """Per bucket (lower bound of its batch sizes): measured tokens/s of each arm."""
        return {
            2**b: {"speculative": v.arms[True].throughput, "plain": v.arms[False].throughput}
            for b, v in sorted(self._buckets.items())
        }
