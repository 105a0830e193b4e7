"""Step timings -> ``StepCost``: a forward pass costs a fixed part up to a knee and a part per row
past it, ``base + per_row x max(0, rows - knee)``, knee fitted too (the best of at most
``MAX_KNEES`` candidates), plus ``e`` per token a draft cache catches up on
(docs/design/adaptive-speculation.md#cost)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trispec.speculation.plan import StepCost, draft_passes

MAX_KNEES = 12  # candidate knees per fit: the fit runs every few steps


class CostFit:
    """The goodput controller's cost side (a part of ``GoodputController``): samples per shape, and
    the fit of ``cost`` from them every few steps."""

    def __init__(self, window: int) -> None:
        self.window = window
        # the last ``window`` samples of each shape: (rows) -> verify seconds, (sequences in each draft
        # pass) -> draft seconds, and catch-up steps. Kept per shape, because a batch that runs
        # plain for a long while repeats one shape; a plain sliding window would then forget what
        # more rows cost, and the fit could no longer tell a pass's fixed cost from a row's
        self._verify_samples: dict[int, deque[float]] = {}
        self._draft_samples: dict[tuple[int, ...], deque[float]] = {}
        self._catch_up_samples: deque[tuple[tuple[int, ...], int, float]] = deque(maxlen=window)
        self.cost: StepCost | None = None
        # refitting is the controller's main cost (about a millisecond): a shape not seen before is
        # news (the model may have been extrapolating there), more samples of known shapes only
        # move their medians
        self.refit_new_shape_every = 4
        self.refit_every = 16
        self._samples = 0
        self._new_shape = False

    def _record_timing(
        self, ks: Sequence[int], draft_s: float, verify_s: float | None, catch_up_tokens: int
    ) -> None:
        """One decode step's samples (see ``GoodputController.record_step``), then the refit when due."""
        if any(ks):
            if catch_up_tokens:
                self._catch_up_samples.append((tuple(draft_passes(ks)), catch_up_tokens, draft_s))
            else:
                self._sample(self._draft_samples, tuple(draft_passes(ks)), draft_s)
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

    def _sample(self, samples: dict[Any, deque[float]], shape: Any, seconds: float) -> None:
        if shape not in samples:
            samples[shape] = deque(maxlen=self.window)
            self._new_shape = True
        samples[shape].append(seconds)

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
            e = _per_catch_up_token(tokens, beyond)
        return c, d, e, knee


def _per_catch_up_token(tokens: np.ndarray, beyond: np.ndarray) -> float:
    """Seconds per catch-up token from what catch-up steps took beyond the fitted passes: a part per
    step plus a part per token. The per-step part is there because a catch-up step always runs the
    draft model, while the passes' fit is the mean over every drafting step, and with suffix decoding
    beside the model many of those cost next to nothing: a line through the origin charged that gap
    to the tokens (measured: 9.4 ms a token where feeding 40 tokens costs 2.7 ms each, from catch-ups
    of 1-6 tokens the draft pool's prefix cache left, after which no request with a prompt started
    drafting). Catch-ups of one length cannot split the two parts: then the line through the origin
    (which overstates, the safe side)."""
    (_, per_token), _ = _nonneg_lstsq(np.column_stack([np.ones_like(tokens), tokens]), beyond)
    if per_token > 0:
        return per_token
    (per_token,), _ = _nonneg_lstsq(tokens[:, None], beyond)
    return per_token


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
