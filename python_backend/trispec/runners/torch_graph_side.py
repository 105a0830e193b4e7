"""The CUDA-graph side of ``TorchSpecRunner``: a step's decodes on ``GraphRound`` when they qualify,
its prompt chunks and prompt tails fed eagerly first (the same step, two launches), and what a round
the graphs could not finish (a kept set too wide for the device) or a failure of the graphs leaves to
the eager path."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from trispec.engine.base import Engine, ForwardInput
from trispec.step import SeqResult, SeqStep, StepResult
from trispec.verifier import prompt_rows

if TYPE_CHECKING:
    from trispec.runners.graph_round import GraphRound

logger = logging.getLogger(__name__)


class GraphSide:
    """Mixed into ``TorchSpecRunner``, whose state and eager round it uses."""

    target: Engine
    graphs: GraphRound | None
    drafting_off: bool
    graph_rounds: int
    eager_rounds: int

    if TYPE_CHECKING:  # TorchSpecRunner's and DraftSide's

        def _eager_round(self, chunks: Sequence[SeqStep], decodes: Sequence[SeqStep]) -> StepResult: ...
        def _undo(self, steps: Sequence[SeqStep]) -> None: ...
        def _rollback_draft(self, seq_id: int, num_verified: int) -> None: ...

    def _graph_round(self, chunks: Sequence[SeqStep], decodes: Sequence[SeqStep]) -> StepResult | None:
        """The decodes on CUDA graphs when they qualify (None: run the step eagerly). Prompt chunks,
        and the prompt tail a decode feeds before its last token, go first in one eager forward: the
        same step, two launches. A sequence whose first verify row could not be sampled on the device
        runs that round eagerly. A failure of the graphs turns them off for good: the step is undone
        and every round runs eagerly."""
        assert self.graphs is not None
        if any(prompt_rows(s) for s in [*chunks, *decodes]):  # prompt log-probs: every fed row's logits
            return None
        ready = [
            s if len(s.token_ids) - s.num_computed == 1 else replace(s, num_computed=len(s.token_ids) - 1)
            for s in decodes
        ]
        plan = self.graphs.plan(ready, self.drafting_off)
        if plan is None:
            return None
        feeds = [ForwardInput(s.seq_id, s.token_ids[s.num_computed : s.feed_to], 0) for s in chunks]
        feeds += [
            ForwardInput(s.seq_id, s.token_ids[s.num_computed : r.num_computed], 0)
            for s, r in zip(decodes, ready)
            if r.num_computed > s.num_computed
        ]
        prefill_s = 0.0
        if feeds:
            t0 = time.perf_counter()
            self.target.forward(feeds)
            prefill_s = time.perf_counter() - t0
        try:
            outcome = self.graphs.run(ready, plan, self._rollback_draft)
        except Exception:
            logger.exception("the CUDA-graph round failed: every round runs eagerly from now on")
            self.graphs = None
            self._undo([*chunks, *decodes])
            return None
        result = outcome.result
        results = dict(result.results)
        for s in chunks:
            results[s.seq_id] = SeqResult(s.seq_id, num_computed=s.feed_to)
        draft_s, verify_s = result.draft_time_s, result.verify_time_s + prefill_s
        if outcome.eager:  # kept sets too wide for the device: those sequences' round, eagerly
            self._undo(outcome.eager)
            redo = self._eager_round([], outcome.eager)
            results.update(redo.results)
            draft_s, verify_s = draft_s + redo.draft_time_s, verify_s + redo.verify_time_s
            self.eager_rounds += 1
        else:
            self.graph_rounds += 1
        return StepResult(results, draft_s, verify_s, draft_catch_up_tokens=result.draft_catch_up_tokens)
