"""``TorchSpecRunner``: one step of draft -> verify -> accept on the PyTorch engine.

Per step, for every sequence of the plan at once: the drafter proposes k tokens per sequence
(batched per draft position; a draft model's cache first takes in what it lacks); ONE batched target
forward scores every sequence's fed tokens and drafts and appends the prompt chunks; the accept rule
keeps each sequence's longest verified prefix plus one target token; both caches are cut back to
exactly what is verified, and the verified tokens' full blocks enter both pools' prefix caches. If
the drafter raises, that step runs as plain decoding (outputs stay the target's) and is counted;
after MAX_DRAFT_FAILURES_IN_A_ROW such steps drafting is off for the process. If the batched target
round raises, it is undone in both caches and rerun one sequence at a time: only a sequence that
fails on its own fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from trispec.config import SpecDecConfig
from trispec.drafters.base import Drafter
from trispec.drafters.none import NoDrafter
from trispec.drafters.prediction import PredictionDrafts
from trispec.engine.base import Engine, ForwardInput
from trispec.engine.kv_cache import blocks_for
from trispec.runners.torch_drafting import MAX_DRAFT_FAILURES_IN_A_ROW, DraftSide
from trispec.runners.torch_graph_side import GraphSide
from trispec.runners.torch_guided import GuidedSide
from trispec.sampling import make_generator
from trispec.sampling_params import SamplingParams
from trispec.step import (
    GRAMMAR_COMPLETE,
    Admitted,
    KVCacheMetrics,
    KVUsage,
    PrefixCacheReset,
    SeqResult,
    SeqStep,
    StepPlan,
    StepResult,
)
from trispec.verifier import prompt_rows, score_prompt, verify_round

if TYPE_CHECKING:
    from trispec.runners.graph_round import GraphRound

logger = logging.getLogger(__name__)
__all__ = ["MAX_DRAFT_FAILURES_IN_A_ROW", "TorchSpecRunner"]


class TorchSpecRunner(DraftSide, GraphSide, GuidedSide):
    def __init__(
        self,
        target: Engine,
        drafter: Drafter | None = None,
        graphs: GraphRound | None = None,
        sampling_rule: str = "coupled",
        grammar_drafts: bool = True,
    ) -> None:
        self.target = target
        # guided sequences: their grammar's state, and whether its forced tokens are drafted
        self._grammars = {}
        self.grammar_drafts = grammar_drafts
        # how sampled tokens are drawn and drafts checked (speculation.sampling_rule)
        self.sampling_rule = sampling_rule
        # greedy rounds as CUDA graph replays (runners/graph_round.py); None: every round eager
        self.graphs = graphs
        self.drafter: Drafter = drafter if drafter is not None else NoDrafter()
        # requests with a predicted output draft from it instead (drafters/prediction.py)
        self.predictions = PredictionDrafts(target.vocab_size)
        self._generators: dict[int, torch.Generator | None] = {}
        self._admitted: set[int] = set()  # in the target's KV now (not preempted)
        # a preempted sequence's prompt as it first found the cache (re-admitted, it finds the blocks
        # it computed itself: no hits of its prompt)
        self._first_context: dict[int, KVCacheMetrics] = {}
        self._drafting: set[int] = set()  # registered with the drafter
        self._draft_failures_in_a_row = 0
        self.drafting_off = False  # set after repeated drafter failures, until restart
        # what each draft cache of the round under way held when it began (what an undo goes back to)
        self._draft_held: dict[int, int] = {}
        # steps whose decodes all ran on the graph path / of which some ran eagerly (steps with
        # prompt chunks alone count in neither)
        self.graph_rounds = 0
        self.eager_rounds = 0

    @classmethod
    def from_config(cls, config: SpecDecConfig) -> TorchSpecRunner:
        from trispec.runners.torch_build import build_engines

        target, drafter = build_engines(config)
        graphs = None
        if config.target.cuda_graphs and config.target.device.startswith("cuda"):
            from trispec.runners.graph_round import graph_round_for

            graphs = graph_round_for(target, drafter, config.scheduler.max_num_draft_tokens)
        return cls(
            target, drafter, graphs, config.speculation.sampling_rule, config.speculation.grammar_drafts
        )

    # -- admission ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def max_context(self) -> int:
        return self.target.max_context

    @property
    def max_context_note(self) -> str:
        return "the target's KV pool and position table (scheduler.max_context)"

    @property
    def shapes_logits(self) -> bool:
        return True

    @property
    def guided_drafts(self) -> bool:
        return True

    @property
    def can_draft(self) -> bool:
        return not isinstance(self.drafter, NoDrafter)

    def can_admit(
        self,
        token_ids: Sequence[int],
        sampling: SamplingParams,
        num_draft_tokens: int = 0,
        cache_salt: str = "",
    ) -> bool:
        usage = self.target.kv_usage()
        num_tokens = len(token_ids) + num_draft_tokens
        # blocks found cached are not taken again, but those no sequence holds leave the free count
        hit, claimed = self.target.probe_prefix(token_ids, cache_salt) if _reuses_prefix(sampling) else (0, 0)
        need = blocks_for(num_tokens, usage.block_size) - hit // usage.block_size + claimed
        return num_tokens <= self.target.max_context and need + len(self._admitted) <= usage.free_blocks

    def add(
        self,
        seq_id: int,
        max_length: int,
        sampling: SamplingParams,
        drafts: bool,
        token_ids: Sequence[int] = (),
        cache_salt: str = "",
    ) -> Admitted:
        self.target.add_sequence(seq_id, max_length, cache_salt)
        self._admitted.add(seq_id)
        reuse = bool(token_ids) and _reuses_prefix(sampling)
        cached = self.target.reuse_prefix(seq_id, token_ids) if reuse else 0
        draft_cached = 0
        if drafts:
            draft_cached = self.drafter.add_sequence(seq_id, max_length, cache_salt, token_ids)
            self._drafting.add(seq_id)
        # the rejection rule's random state: the request's own, so its draws never depend on what it
        # is batched with, nor on whether it was preempted and recomputed (the coupled rule draws
        # nothing: its noise is keyed by seed and position)
        if seq_id not in self._generators:
            self._generators[seq_id] = make_generator(sampling) if sampling.samples_by_rejection else None
        return Admitted(cached, draft_cached)

    def room_for(self, steps: Sequence[SeqStep]) -> bool:
        lengths = {s.seq_id: s.feed_to + s.num_draft_tokens for s in steps}
        return self.target.room_for(lengths) and self._seeded_drafts_fit(steps)

    def preempt(self, seq_id: int) -> None:
        if seq_id in self._admitted and seq_id not in self._first_context:
            first = self.target.kv_cache_metrics(seq_id)
            if first is not None:
                self._first_context[seq_id] = first
        self._release(seq_id)

    def free(self, seq_id: int) -> None:
        self._release(seq_id)
        self._first_context.pop(seq_id, None)
        self._generators.pop(seq_id, None)
        self._drop_grammar(seq_id)

    def _release(self, seq_id: int) -> None:
        self.predictions.free(seq_id)
        if seq_id in self._admitted:  # a preempted sequence holds no KV
            self.target.free(seq_id)
            self._admitted.discard(seq_id)
        if seq_id in self._drafting:
            self._drafting.discard(seq_id)
            try:
                self.drafter.free(seq_id)
            except Exception:  # a broken drafter must not keep the target's blocks from returning
                logger.exception("the drafter failed to free sequence %d", seq_id)

    def cached_length(self, seq_id: int) -> int:
        return self.target.cached_length(seq_id)

    def kv_cache_metrics(self, seq_id: int) -> KVCacheMetrics | None:
        now = self.target.kv_cache_metrics(seq_id) if seq_id in self._admitted else None
        first = self._first_context.get(seq_id)
        if now is None or first is None:
            return now
        # what its prompt found when it first came; the blocks taken for it, in every admission
        return replace(
            first,
            alloc_new_blocks=first.alloc_new_blocks + now.alloc_new_blocks,
            alloc_total_blocks=first.alloc_total_blocks + now.alloc_total_blocks,
        )

    def kv_usage(self) -> dict[str, KVUsage]:
        pools = {"target": self.target.kv_usage()}
        draft = self.drafter.kv_usage()
        if draft is not None:
            pools["drafter"] = draft
        return pools

    def reset_prefix_cache(self) -> dict[str, PrefixCacheReset]:
        pools = {"target": self.target.reset_prefix_cache()}
        draft = self.drafter.reset_prefix_cache()
        if draft is not None:
            pools["drafter"] = draft
        return pools

    # -- the step ----------------------------------------------------------------------------
    def run(self, plan: StepPlan) -> StepResult:
        if not plan.steps:
            return StepResult()
        try:
            result = self._round(plan.steps)
        except Exception as exc:
            result = self._isolate(plan.steps, exc)
        self._cache_verified(plan.steps, result)
        return result

    def _cache_verified(self, steps: Sequence[SeqStep], result: StepResult) -> None:
        """Each sequence's caches now hold only verified tokens: their full blocks may be shared."""
        for s in steps:
            r = result.results.get(s.seq_id)
            if r is None or r.error is not None:
                continue
            verified = [*s.token_ids, *r.new_token_ids][: r.num_computed]
            self.target.cache_verified(s.seq_id, verified)
            if s.seq_id in self._drafting and not self.drafting_off:
                try:
                    self.drafter.cache_verified(s.seq_id, verified)
                except Exception as exc:
                    self._drafting_off(f"the drafter could not index sequence {s.seq_id} ({exc!r})")

    def _round(self, steps: Sequence[SeqStep]) -> StepResult:
        self._draft_held = self._draft_lengths(steps)  # first: whatever raises next is undone to it
        chunks = [s for s in steps if s.is_prompt_chunk]
        decodes = [s for s in steps if not s.is_prompt_chunk]
        for s in steps:
            if self.target.cached_length(s.seq_id) != s.num_computed:
                raise RuntimeError(
                    f"seq {s.seq_id}: the plan says {s.num_computed} tokens are cached, the cache holds "
                    f"{self.target.cached_length(s.seq_id)}"
                )
        graphed = self._graph_round(chunks, decodes) if self.graphs is not None and decodes else None
        if graphed is not None:
            return graphed
        if decodes:
            self.eager_rounds += 1
        return self._eager_round(chunks, decodes)

    def _eager_round(self, chunks: Sequence[SeqStep], decodes: Sequence[SeqStep]) -> StepResult:
        t0 = time.perf_counter()
        guides = self._grammar_states(decodes)
        forced = self._forced_drafts(decodes, guides)
        drafts, draft_failed = self._draft(decodes, forced, guides)
        drafts, masks = self._guided_round(decodes, guides, forced, drafts)
        t1 = time.perf_counter()
        # one batched target pass: each decode feeds its new tokens + drafts and wants logits for the
        # last k + 1 (row i scores draft i, the last row the bonus); prompt chunks want none
        # (a request asking for prompt log-probs wants every fed position's logits: its prompt rows
        # first, its verify rows last)
        feeds = [[*s.token_ids[s.num_computed :], *d.tokens] for s, d in zip(decodes, drafts)]
        feeds += [list(s.token_ids[s.num_computed : s.feed_to]) for s in chunks]
        wanted = [len(d.tokens) + 1 for d in drafts] + [0] * len(chunks)
        fed = [*decodes, *chunks]
        inputs = [
            ForwardInput(s.seq_id, feed, len(feed) if prompt_rows(s) else n)
            for s, feed, n in zip(fed, feeds, wanted)
        ]
        logits = self.target.forward(inputs)
        results = {}
        scored = {s.seq_id: score_prompt(s, out[:n]) for s, out in zip(fed, logits) if (n := prompt_rows(s))}
        if scored:
            logits = [rows[-(len(d.tokens) + 1) :] for d, rows in zip(drafts, logits)]
        verified = verify_round(decodes, drafts, logits[: len(decodes)], self._generators, masks)
        for s, draft, guide, rows, outcome in zip(decodes, drafts, guides, masks, verified):
            accepted = outcome.accepted
            # the caches keep the fed tokens and the accepted drafts; the target's own token is
            # fed in the next step
            computed = s.feed_to + accepted.num_accepted
            self.target.truncate(s.seq_id, computed)
            self._rollback_draft(s.seq_id, computed)
            grammar_end, text_ends = None, ()
            if guide is not None and not accepted.tokens:  # no token allowed: complete, or a dead end
                dead_end = outcome.dead_end or guide.dead_end_reason()
                grammar_end = GRAMMAR_COMPLETE if guide.complete else dead_end
            elif guide is not None and rows is not None:  # end ids it took as text do not end it
                text_ends = guide.text_end_ids(accepted.tokens, rows.may_end)
            results[s.seq_id] = SeqResult(
                s.seq_id,
                accepted.tokens,
                len(draft.tokens),
                accepted.num_accepted,
                computed,
                log_probs=outcome.log_probs,
                top_log_probs=outcome.top_log_probs,
                prompt_log_probs=scored.get(s.seq_id),
                grammar_end=grammar_end,
                end_ids_as_text=text_ends,
            )
        for s in chunks:
            scores = scored.get(s.seq_id)
            results[s.seq_id] = SeqResult(s.seq_id, num_computed=s.feed_to, prompt_log_probs=scores)
        catch_up = sum(d.catch_up_tokens for d in drafts)
        return StepResult(
            results,
            t1 - t0,
            time.perf_counter() - t1,
            draft_catch_up_tokens=catch_up,
            draft_failed=draft_failed,
        )

    def _isolate(self, steps: Sequence[SeqStep], exc: Exception) -> StepResult:
        """A batched round raised: undo it, then rerun each sequence alone so that only the ones
        that fail on their own are failed; the rest of the batch carries on."""
        self._undo(steps)
        if len(steps) == 1:
            return StepResult({steps[0].seq_id: self._failed(steps[0], exc)}, isolated=True)
        logger.warning("a batched round of %d sequences failed (%r); retrying one by one", len(steps), exc)
        results: dict[int, SeqResult] = {}
        draft_s = verify_s = 0.0
        for step in steps:
            try:
                alone = self._round([step])
            except Exception as seq_exc:
                self._undo([step])
                results[step.seq_id] = self._failed(step, seq_exc)
            else:
                results.update(alone.results)
                draft_s, verify_s = draft_s + alone.draft_time_s, verify_s + alone.verify_time_s
        return StepResult(results, draft_s, verify_s, isolated=True)

    @staticmethod
    def _failed(step: SeqStep, exc: Exception) -> SeqResult:
        logger.error("request %d failed: %r", step.seq_id, exc, exc_info=exc)
        error = f"{type(exc).__name__}: {exc}"
        return SeqResult(step.seq_id, num_computed=step.num_computed, error=error)

    def _undo(self, steps: Sequence[SeqStep]) -> None:
        """Forget anything a failed round put in either cache: the target's back to the planned
        tokens, a draft cache back to what it held when the round began (it may hold more of the
        prompt than the target has computed: what its pool's prefix cache gave it)."""
        for s in steps:
            if self.target.cached_length(s.seq_id) > s.num_computed:
                self.target.truncate(s.seq_id, s.num_computed)
            self._rollback_draft(s.seq_id, self._draft_held.get(s.seq_id, 0))


def _reuses_prefix(sampling: SamplingParams) -> bool:
    """Whether a sequence takes its prompt's start from the target's prefix cache: not one asking for
    prompt log-probs, which needs every prompt position's logits (admission counts no hits for it)."""
    return not sampling.prompt_log_probs
