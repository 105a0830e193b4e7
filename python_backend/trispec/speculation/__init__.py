"""How many tokens to draft, per request and per step: the measured goodput choice.

Each step, every request gets the k in 0..its own ``num_draft_tokens`` that maximises the step's
expected tokens per second, from its measured acceptance and a cost model fitted to the step
timings; k = 0 everywhere when drafting does not pay. The choice changes speed only: the output is
the target's either way. Design and measurements: docs/design/adaptive-speculation.md.

* ``plan``: the pure choice (``choose_ks``) and the cost model's shape (``StepCost``);
* ``acceptance_rates``: per request, shrunk towards all requests';
* ``cost_fit``: step timings -> ``StepCost``;
* ``exploration``: warm-up, and drafting now and then so that both sides stay measured;
* ``controller``: ``GoodputController``, which puts them together per step.
"""

from trispec.speculation.controller import IN_STEP_LAG, GoodputController
from trispec.speculation.cost_fit import MAX_KNEES
from trispec.speculation.plan import StepCost, choose_ks, draft_passes, expected_tokens

__all__ = [
    "IN_STEP_LAG",
    "MAX_KNEES",
    "GoodputController",
    "StepCost",
    "choose_ks",
    "draft_passes",
    "expected_tokens",
]
