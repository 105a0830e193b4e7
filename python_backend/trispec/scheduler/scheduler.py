"""``Scheduler``: the plan of each step (``schedule``) and its bookkeeping after it (``postprocess``);
requests come in through ``Intake``, run through ``Admission``, and go out as ``outputs``."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.guided.compiler import GrammarCompiler
from trispec.runners.base import SpecRunner
from trispec.scheduler.admission import Admission
from trispec.scheduler.intake import Intake, limits_for
from trispec.scheduler.outputs import RequestOutput, apply_result, request_output
from trispec.sequence import FinishReason, Sequence
from trispec.speculation import GoodputController
from trispec.stats import EngineStats
from trispec.step import SeqStep, StepPlan, StepResult


class Scheduler(Intake, Admission):
    """Books only, never a tensor: the step between ``schedule`` and ``postprocess`` is the runner's."""

    def __init__(
        self,
        runner: SpecRunner,
        config: SchedulerConfig,
        *,
        encode: Callable[[str], list[int]],
        make_text_tracker: Callable[[list[str]], StopTextTracker],
        eos_ids: frozenset[int],
        clock: Callable[[], float] = time.monotonic,
        encode_words: Callable[[str], list[int]] | None = None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        # the runner's admission bookkeeping (can_admit / add / free); the step itself is LLMEngine's
        self.runner = runner
        self.config = config
        self.clock = clock
        # serving under overload (set by the serving loop from scheduler.max_queue_delay_s): a request
        # not started after this long takes the place of a sequence that has streamed at least as
        # long; None (offline, benchmark): requests wait their turn
        self.urgent_after_s: float | None = None
        Intake.__init__(
            self,
            limits_for(runner, config),
            encode=encode,
            make_text_tracker=make_text_tracker,
            eos_ids=eos_ids,
            encode_words=encode_words,
            grammars=grammars,
        )
        self.stats = EngineStats()
        self.controller = GoodputController() if config.adaptive_speculation and runner.can_draft else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def queued_ids(self) -> list[int]:
        """Requests not started yet (submitted, or waiting for a first slot), oldest first; a
        preempted request waiting to resume is not among them."""
        with self._lock:
            inbox = [s.seq_id for s in self._inbox] + [entry[0] for entry in self._untokenized]
            return [s.seq_id for s in self.waiting if not s.preemptions] + sorted(inbox)

    def passed_over_ids(self) -> list[int]:
        """Requests an admission pass has seen and left waiting for a slot (not preempted ones),
        oldest first. One still in the inbox has had no chance yet: a long step delays it, not a
        full batch."""
        with self._lock:
            return [s.seq_id for s in self.waiting if not s.preemptions]

    def has_work(self) -> bool:
        with self._lock:
            return bool(
                self.waiting or self.running or self._inbox or self._untokenized or self._pending_outputs
            )

    # -- 1. schedule -------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        arrived = self._tokenize_arrivals()  # outside the lock: a long prompt takes a while
        with self._lock:
            self._take_inbox(arrived)
            self._admit()
            return StepPlan(self._fit(self._choose_ks(self._plan())))

    def _plan(self) -> list[SeqStep]:
        steps: list[SeqStep] = []
        budget = self.config.max_prefill_tokens_per_step
        for seq in self.running:
            # prompt tokens the runner lacks beyond the one pending token; they ride along with it
            # when the budget allows, else the sequence gets a prompt chunk this step
            extra = seq.num_tokens - seq.num_computed - 1
            if extra <= budget:
                budget -= extra
                steps.append(self._step(seq, seq.num_tokens, self._k_with_prompt(seq, extra)))
            elif budget > 0:
                steps.append(self._step(seq, seq.num_computed + budget, 0))
                budget = 0
        return steps

    def _choose_ks(self, steps: list[SeqStep]) -> list[SeqStep]:
        """The adaptive controller's k for each decode step (at most the request's own). Under the
        rejection rule a seeded sampled request always drafts its own k: its random draws, hence its
        output, depend on k, and the seed promises the same output on every run. Under the coupled
        rule every request's output is the same whatever k: the controller chooses for all."""
        if self.controller is None:
            return steps
        free = [
            i
            for i, s in enumerate(steps)
            if not s.is_prompt_chunk
            and not self._seq(s.seq_id).keeps_its_k
            and len(s.token_ids) - s.num_computed == 1  # a step feeding prompt tokens drafts nothing
        ]
        if not free:
            return steps
        seqs = [self._seq(steps[i].seq_id) for i in free]
        # running but not decoding yet: a prompt chunk this step, or none when the prefill budget ran out
        prefilling = len(self.running) - sum(not s.is_prompt_chunk for s in steps)
        room = max(0, self.config.max_batch_size - len(self.running))
        ks = self.controller.choose(
            [steps[i].seq_id for i in free],
            [steps[i].num_draft_tokens for i in free],
            lags=[s.num_tokens - s.draft_synced for s in seqs],
            remaining=[s.remaining_tokens for s in seqs],
            joining=prefilling + min(len(self.waiting), room),
        )
        steps = list(steps)
        for i, k in zip(free, ks):
            s = steps[i]
            steps[i] = SeqStep(s.seq_id, s.token_ids, s.num_computed, s.feed_to, k, s.sampling)
        return steps

    @staticmethod
    def _k_with_prompt(seq: Sequence, extra: int) -> int:
        """A decode step that also feeds ``extra`` prompt tokens (its first, or the rest of a prompt a
        prefix-cache hit left) drafts nothing: its first token comes with the target's prefill alone,
        not after a draft model has caught up on the prompt (that happens in the next round). Not for
        a request whose output depends on its drafts (the rejection rule, seeded): it keeps its k."""
        return seq.num_draft_tokens if extra == 0 or seq.keeps_its_k else 0

    def _step(self, seq: Sequence, feed_to: int, k: int) -> SeqStep:
        # never draft past max_tokens: the last round needs room for the target's own token
        k = min(k, seq.remaining_tokens - 1) if seq.drafts else 0
        return SeqStep(seq.seq_id, seq.token_ids, seq.num_computed, feed_to, max(k, 0), seq.sampling)

    def _take_inbox(self, arrived: list[Sequence]) -> None:
        """Queue new requests, oldest first, and apply cancellations (caller holds the lock)."""
        # in the order the requests came (a tokenised one may have come after a deferred one)
        self.waiting.extend(sorted([*arrived, *self._inbox], key=lambda s: s.seq_id))
        self._inbox.clear()
        cancels, self._cancels = self._cancels, set()
        for seq in [*self.waiting, *self.running]:
            if seq.seq_id in cancels:
                seq.finish_reason = FinishReason.CANCELLED
                self._pending_outputs.append(request_output(seq, [], seq.text.finish()))
        for seq in self.waiting:
            if seq.finished and seq.preemptions:  # the runner still holds its random state
                self.runner.free(seq.seq_id)
        self.waiting = deque(s for s in self.waiting if not s.finished)
        self._retire()

    # -- 3. postprocess ------------------------------------------------------------------------
    def postprocess(self, plan: StepPlan, result: StepResult) -> list[RequestOutput]:
        outputs, self._pending_outputs = self._pending_outputs, []
        if not plan.steps:
            return outputs
        self.stats.steps += 1
        decodes = plan.decodes
        self._learn(plan, result)
        if decodes:
            if result.isolated:  # rerun one by one: batches of one
                for _ in decodes:
                    self.stats.record_verify_batch(1)
            else:
                self.stats.record_verify_batch(len(decodes))
        self.stats.draft_failures += result.draft_failed
        self.stats.draft_time_s += result.draft_time_s
        self.stats.verify_time_s += result.verify_time_s
        for step in plan.steps:
            seq = self._seq(step.seq_id)
            seq_result = result.results[step.seq_id]
            if seq_result.error is not None:
                seq.finish_reason = FinishReason.ERROR
                seq.error = seq_result.error
                outputs.append(request_output(seq, [], ""))
                continue
            # tokens fed besides a decode's pending one: prompt (or, after preemption, recompute)
            self.stats.prefill_tokens += step.feed_to - step.num_computed - (not step.is_prompt_chunk)
            seq.num_computed = seq_result.num_computed
            if seq_result.prompt_log_probs is not None:
                seq.take_prompt_scores(seq_result.prompt_log_probs)
            if step.is_prompt_chunk:
                continue
            if seq_result.num_drafted:  # the draft cache now holds what the target's does
                seq.draft_synced = seq_result.num_computed
            if not seq.output_ids:  # its first round: what its prompt found cached and took is known
                self._record_kv_metrics(seq)
            seq.stats.draft_time_s += result.draft_time_s
            seq.stats.verify_time_s += result.verify_time_s
            outputs.append(apply_result(seq, seq_result, step.num_draft_tokens, self.stats))
        self._retire()
        return outputs

    def _record_kv_metrics(self, seq: Sequence) -> None:
        seq.kv_metrics = metrics = self.runner.kv_cache_metrics(seq.seq_id)
        self.stats.prompt_tokens += len(seq.prompt_ids)
        if metrics is not None:
            self.stats.cached_prompt_tokens += min(metrics.cached_tokens, len(seq.prompt_ids))

    def _learn(self, plan: StepPlan, result: StepResult) -> None:
        """Feed the adaptive controller each round's acceptance and the step's timing (a round rerun
        one sequence at a time says nothing about batches)."""
        if self.controller is None:
            return
        decodes = plan.decodes
        for s in decodes:
            r = result.results[s.seq_id]
            if r.error is None:
                self.controller.record_round(s.seq_id, r.num_drafted, r.num_accepted)
        if not decodes or result.isolated:
            return
        ks = [result.results[s.seq_id].num_drafted for s in decodes]
        prompt_rows = len(decodes) != len(plan.steps) or any(
            len(s.token_ids) - s.num_computed != 1 for s in decodes
        )
        # prompt rows make the target pass's time say nothing about verifying; the draft time stays
        verify_s = None if prompt_rows else result.verify_time_s
        tokens = sum(len(result.results[s.seq_id].new_token_ids) for s in decodes)
        self.controller.record_step(ks, result.draft_time_s, verify_s, result.draft_catch_up_tokens, tokens)

    def _retire(self) -> None:
        for seq in self.running:
            if seq.finished:
                self.runner.free(seq.seq_id)
                if self.controller is not None:
                    self.controller.forget(seq.seq_id)
                self.stats.requests_finished += 1
        self.running = [s for s in self.running if not s.finished]

    def _seq(self, seq_id: int) -> Sequence:
        return next(s for s in self.running if s.seq_id == seq_id)
