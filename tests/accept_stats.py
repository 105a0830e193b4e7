"""What the accept-rule tests (``test_accept.py``, ``test_accept_rules.py``) share: the tiny vocabulary,
the rule's signature, a seeded generator and the chi-square p-value of counts against expected
probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from scipy.stats import chi2, chisquare
from trispec.accept import AcceptResult

V = 6


AcceptRule = Callable[[Sequence[int], torch.Tensor, torch.Tensor, "torch.Generator | None"], AcceptResult]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of ``counts`` to ``probs``; 2-D inputs are independent rows (contexts).

    Each row is tested against its own total (a conditional distribution), and the row statistics
    are summed with their degrees of freedom. A count where the probability is 0 is impossible
    under the target: p-value 0. Cells expecting fewer than 5 are pooled within their row so the
    chi-square approximation holds.
    """
    counts_rows = counts.double().reshape(-1, counts.shape[-1]).numpy()
    probs_rows = probs.double().reshape(-1, probs.shape[-1]).numpy()
    statistic, dof = 0.0, 0
    for obs, prob in zip(counts_rows, probs_rows, strict=True):
        if obs[prob <= 0].sum() > 0:
            return 0.0
        obs, prob = obs[prob > 0], prob[prob > 0]
        expected = prob / prob.sum() * obs.sum()
        small = expected < 5
        if small.any():
            obs = np.append(obs[~small], obs[small].sum())
            expected = np.append(expected[~small], expected[small].sum())
        if len(obs) >= 2:  # one bin (or an empty row) carries no information
            statistic += float(chisquare(obs, expected).statistic)
            dof += len(obs) - 1
    return float(chi2.sf(statistic, dof)) if dof else 1.0
