"""Per-request sampling settings, validated (no tensors here: the scheduler side imports this)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from trispec.errors import InvalidInputError

# torch.Generator.manual_seed accepts any value representable in 64 bits; we keep seeds non-negative.
_MAX_SEED = 2**64 - 1


def _real(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputError(field, f"must be a number, got {value!r}")
    return float(value)


def _integral(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(field, f"must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. Invalid values raise :class:`InvalidInputError` naming the field."""

    temperature: float = 0.0  # 0 => greedy
    top_k: int = 0  # 0 => off
    top_p: float = 1.0  # 1.0 => off
    seed: int | None = None

    def __post_init__(self) -> None:
        # Values often arrive as numpy scalars (Triton request tensors): accept any real / integral
        # number, then store builtin float / int so the params hash, compare and print plainly.
        # bool is an Integral too; `top_k=True` is almost certainly a client bug, so it is refused.
        temperature = _real("temperature", self.temperature)
        if not math.isfinite(temperature) or temperature < 0:
            raise InvalidInputError("temperature", f"must be finite and >= 0, got {self.temperature!r}")
        top_k = _integral("top_k", self.top_k)
        if top_k < 0:
            raise InvalidInputError("top_k", f"must be >= 0 (0 = off), got {self.top_k!r}")
        top_p = _real("top_p", self.top_p)
        # top_p == 0 would keep nothing; the nucleus always keeps the top token anyway, so ask for > 0.
        if not 0.0 < top_p <= 1.0:  # also refuses NaN
            raise InvalidInputError("top_p", f"must be in (0, 1] (1 = off), got {self.top_p!r}")
        seed = None if self.seed is None else _integral("seed", self.seed)
        if seed is not None and not 0 <= seed <= _MAX_SEED:
            raise InvalidInputError("seed", f"must be in [0, 2**64), got {self.seed!r}")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "seed", seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def seeded(self) -> bool:
        """Sampled with a seed: the same output is promised on every run, so its draws (which
        depend on how many drafts each round checks) must see the same k whatever it shares."""
        return not self.greedy and self.seed is not None
