"""What the adaptive-k tests (``test_controller_*.py``) share: a cheap draft's cost table and a driver
that feeds the goodput controller rounds and step timings.
"""

from __future__ import annotations

import random

from trispec.speculation import GoodputController, StepCost, draft_passes

# memory-bound target (rows nearly free), a cheap draft: drafting pays
CHEAP = StepCost(target_base_s=0.030, target_row_s=0.0005, draft_pass_s=0.003, draft_seq_s=0.0002)


# -- the online estimates -----------------------------------------------------------------------------
def drive(controller: GoodputController, truth: StepCost, accept: float, batch: int, steps: int) -> list[int]:
    """Run ``steps`` decisions for a fixed batch whose drafts are accepted with rate ``accept``, timing
    each step by ``truth``; returns the k chosen for sequence 0 at each step."""
    rng = random.Random(1)
    ids = list(range(batch))
    chosen = []
    for _ in range(steps):
        ks = controller.choose(ids, [4] * batch)
        chosen.append(ks[0])
        for seq_id, k in zip(ids, ks):
            accepted = 0
            while accepted < k and rng.random() < accept:
                accepted += 1
            controller.record_round(seq_id, k, accepted)
        draft_s = sum(truth.draft_pass_seconds(n) for n in draft_passes(ks))
        controller.record_step(ks, draft_s, truth.target_seconds(sum(k + 1 for k in ks)))
    return chosen
