"""The scheduler: admission, the plan of each step, and what a step's result means for each request.

It keeps books only; it never touches a tensor or a model. ``schedule()``:
  1. take in new requests and cancellations (thread-safe inbox: a server thread feeds it);
  2. admit waiting requests while the batch has room and the runner's KV has their first step;
  3. plan prompt prefill under the per-step token budget (long prompts go in chunks, k = 0);
  4. give every ready sequence its k for this step (0 when the adaptive controller chose plain);
  5. fit the step into the KV pool: KV is taken as sequences grow, and when the pool would run
     out the most recently admitted sequence is preempted (freed, queued first, recomputed).
``postprocess(plan, result)``: record what the runner now holds, emit verified tokens and the text
safe to show, finish requests on end id / stop string / max_tokens / error, free them, keep stats.

The draft-verify-accept work in between is the runner's (runners/, behind ``SpecRunner``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest, Limits, validate_request
from trispec.runners.base import SpecRunner
from trispec.sampling_params import SamplingParams
from trispec.sequence import FinishReason, Sequence
from trispec.speculation import GoodputController
from trispec.stats import AcceptanceStats, EngineStats
from trispec.step import SeqResult, SeqStep, StepPlan, StepResult


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: only verified tokens, and text safe to show."""

    request_id: int
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    stats: AcceptanceStats
    # why the request failed (finish_reason ERROR): the runner failed on this sequence alone
    error: str | None = None
    # a request queued with ``tokenize_later`` that turned out invalid once tokenised (too long, ...)
    invalid: InvalidInputError | None = None
    # log-probability of each of ``new_token_ids`` when the request asked for them
    new_log_probs: list[float] | None = None
    num_prompt_tokens: int = 0
    # wall clock (time.time_ns) when the request was first admitted into the batch
    first_scheduled_ns: int | None = None


class Scheduler:
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
    ) -> None:
        # the runner's admission bookkeeping (can_admit / add / free); the step itself is LLMEngine's
        self.runner = runner
        self.config = config
        self.encode = encode
        # a piece of text inside a sequence (bad words): no BOS
        self.encode_words = encode_words or encode
        self.make_text_tracker = make_text_tracker
        self.eos_ids = eos_ids
        self.clock = clock
        # serving under overload (set by the serving loop from scheduler.max_queue_delay_s): a request
        # not started after this long takes the place of a sequence that has streamed at least as
        # long; None (offline, benchmark): requests wait their turn
        self.urgent_after_s: float | None = None
        max_k = config.max_num_draft_tokens if runner.can_draft else 0
        max_context, context_note = runner.max_context, runner.max_context_note
        if config.max_context is not None and config.max_context < max_context:
            max_context, context_note = config.max_context, "scheduler.max_context"
        self.limits = Limits(
            max_context=max_context,
            context_note=context_note,
            max_num_draft_tokens=max_k,
            default_num_draft_tokens=min(config.default_num_draft_tokens, max_k),
            vocab_size=runner.vocab_size,
        )
        self.stats = EngineStats()
        self.controller = GoodputController() if config.adaptive_speculation and runner.can_draft else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._ids = itertools.count()
        # guards the inbox and the waiting queue, which other threads read (queued_ids, has_work)
        # while schedule() changes them
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._untokenized: list[tuple[int, GenerationRequest, float]] = []
        self._cancels: set[int] = set()
        # outputs that arise while scheduling (cancellations), returned by the next postprocess
        self._pending_outputs: list[RequestOutput] = []

    # -- called from any thread ------------------------------------------------------------
    def add_request(self, request: GenerationRequest, tokenize_later: bool = False) -> int:
        """Validate and queue a request; returns its id. Raises InvalidInputError naming the field.

        ``tokenize_later``: a text prompt is tokenised (and what depends on its length validated) by
        the next ``schedule()``, on the thread that steps the engine, so that the caller (a server's
        request thread) never spends time on it; an invalid one then ends with an output whose
        ``invalid`` says why."""
        if request.prompt_token_ids is None and (not isinstance(request.prompt, str) or not request.prompt):
            raise InvalidInputError("prompt", "must be a non-empty string")
        if tokenize_later and request.prompt_token_ids is None:
            with self._lock:
                seq_id = next(self._ids)
                self._untokenized.append((seq_id, request, self.clock()))
            return seq_id
        seq = self._sequence(request, arrived_at=self.clock())
        with self._lock:
            seq.seq_id = next(self._ids)
            self._inbox.append(seq)
        return seq.seq_id

    def _sequence(self, request: GenerationRequest, seq_id: int = -1, arrived_at: float = 0.0) -> Sequence:
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            prompt_ids = self.encode(request.prompt)  # type: ignore[arg-type]
        num_draft_tokens = validate_request(request, prompt_ids, self.limits)
        if request.end_id is None:
            end_ids = self.eos_ids
        else:
            end_ids = frozenset() if request.end_id == -1 else frozenset([request.end_id])
        # what shapes the distribution and depends on the tokenizer or the prompt (logits_rules.py)
        sampling = replace(
            request.sampling,
            bad_words_ids=tuple(tuple(ids) for ids in map(self.encode_words, request.bad_words) if ids),
            end_ids=end_ids,
            prompt_len=len(prompt_ids),
        )
        if not self.runner.shapes_logits:
            _refuse_logits_rules(sampling)
        return Sequence(
            seq_id=seq_id,
            prompt_ids=prompt_ids,
            max_tokens=request.max_tokens,
            num_draft_tokens=num_draft_tokens,
            sampling=sampling,
            text=self.make_text_tracker(list(request.stop)),
            drafts=num_draft_tokens > 0,
            arrived_at=arrived_at,
        )

    def cancel(self, request_id: int) -> None:
        """Stop a request at the next step; its KV blocks return to the pool."""
        with self._lock:
            self._cancels.add(request_id)

    def queued_ids(self) -> list[int]:
        """Requests not started yet (submitted, or waiting for a first slot), oldest first; a
        preempted request waiting to resume is not among them."""
        with self._lock:
            inbox = [s.seq_id for s in self._inbox] + [seq_id for seq_id, _, _ in self._untokenized]
            return [s.seq_id for s in self.waiting if not s.preemptions] + sorted(inbox)

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
                steps.append(self._step(seq, seq.num_tokens, seq.num_draft_tokens))
            elif budget > 0:
                steps.append(self._step(seq, seq.num_computed + budget, 0))
                budget = 0
        return steps

    def _fit(self, steps: list[SeqStep]) -> list[SeqStep]:
        """KV blocks are taken as sequences grow: while the step would not fit the runner's pool,
        preempt the most recently admitted sequence. A lone sequence always fits without drafts
        (prompt + max_tokens <= max_context <= the pool)."""
        while steps and not self.runner.room_for(steps):
            if len(self.running) > 1:
                victim = self._victim() or self.running[-1]
                self._preempt(victim)
                steps = [s for s in steps if s.seq_id != victim.seq_id]
            elif any(s.num_draft_tokens for s in steps):
                steps = [replace(s, num_draft_tokens=0) for s in steps]
            else:
                break  # cannot happen within max_context; the runner then fails the sequence
        return steps

    def _victim(self, min_run_s: float = 0.0) -> Sequence | None:
        """The most recently admitted sequence that has streamed a token (a request's first token is
        never delayed by preemption) and has run for at least ``min_run_s`` since its admission."""
        now = self.clock()
        return next(
            (s for s in reversed(self.running) if s.output_ids and now - s.admitted_at >= min_run_s), None
        )

    def _preempt(self, seq: Sequence) -> None:
        """Free the sequence's KV and queue it first in line; re-admitted, it recomputes its verified
        tokens (the text it already sent stays sent and is never sent again)."""
        self.runner.preempt(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.draft_synced = 0
        seq.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(seq)

    def _choose_ks(self, steps: list[SeqStep]) -> list[SeqStep]:
        """The adaptive controller's k for each decode step (at most the request's own). A seeded
        sampled request always drafts its own k: its random draws, hence its output, depend on k,
        and the seed promises the same output on every run."""
        if self.controller is None:
            return steps
        free = [
            i
            for i, s in enumerate(steps)
            if not s.is_prompt_chunk and not self._seq(s.seq_id).seeded_sampling
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

    def _step(self, seq: Sequence, feed_to: int, k: int) -> SeqStep:
        # never draft past max_tokens: the last round needs room for the target's own token
        k = min(k, seq.remaining_tokens - 1) if seq.drafts else 0
        return SeqStep(seq.seq_id, seq.token_ids, seq.num_computed, feed_to, max(k, 0), seq.sampling)

    def _tokenize_arrivals(self) -> list[Sequence]:
        """Requests queued with ``tokenize_later``, tokenised and validated; invalid ones end here."""
        with self._lock:
            untokenized, self._untokenized = self._untokenized, []
        arrived = []
        for seq_id, request, arrived_at in untokenized:
            try:
                seq = self._sequence(request, seq_id, arrived_at)
            except InvalidInputError as exc:
                refused = RequestOutput(
                    seq_id, [], "", True, FinishReason.ERROR, AcceptanceStats(), str(exc), exc
                )
                self._pending_outputs.append(refused)
                continue
            arrived.append(seq)
        return arrived

    def _take_inbox(self, arrived: list[Sequence]) -> None:
        """Queue new requests, oldest first, and apply cancellations (caller holds the lock)."""
        # in the order the requests came (a tokenised one may have come after a deferred one)
        self.waiting.extend(sorted([*arrived, *self._inbox], key=lambda s: s.seq_id))
        self._inbox.clear()
        cancels, self._cancels = self._cancels, set()
        for seq in [*self.waiting, *self.running]:
            if seq.seq_id in cancels:
                seq.finish_reason = FinishReason.CANCELLED
                self._pending_outputs.append(self._output(seq, [], seq.text.finish()))
        for seq in self.waiting:
            if seq.finished and seq.preemptions:  # the runner still holds its random state
                self.runner.free(seq.seq_id)
        self.waiting = deque(s for s in self.waiting if not s.finished)
        self._retire()

    def _admit(self) -> None:
        while self.waiting and self._fits_now(self.waiting[0]):
            self._start(self.waiting.popleft())
        if self.urgent_after_s is not None:
            self._admit_urgent(self.urgent_after_s)

    def _fits_now(self, seq: Sequence) -> bool:
        # its first step: every verified token and the drafts
        return len(self.running) < self.config.max_batch_size and self.runner.can_admit(
            seq.num_tokens + seq.num_draft_tokens
        )

    def _start(self, seq: Sequence) -> None:
        self.runner.add(seq.seq_id, seq.max_length, seq.sampling, seq.drafts)
        seq.admitted_at = self.clock()
        if seq.first_scheduled_ns is None:
            seq.first_scheduled_ns = time.time_ns()
        self.running.append(seq)

    def _admit_urgent(self, after_s: float) -> None:
        """Overload: a request not started after ``after_s`` takes the place of the most recently
        admitted sequence that has streamed for at least as long (preempted, it resumes later), so
        time to first token stays bounded while the batch or the KV pool is full. The requests
        still waiting are refused by the serving loop at ``max_queue_delay_s``."""
        now = self.clock()
        urgent = [s for s in self.waiting if not s.preemptions and now - s.arrived_at >= after_s]
        for seq in urgent:
            while not self._fits_now(seq):
                victim = self._victim(min_run_s=after_s)
                if victim is None:
                    return
                self._preempt(victim)
            self.waiting.remove(seq)
            self._start(seq)

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
                outputs.append(self._output(seq, [], ""))
                continue
            # tokens fed besides a decode's pending one: prompt (or, after preemption, recompute)
            self.stats.prefill_tokens += step.feed_to - step.num_computed - (not step.is_prompt_chunk)
            seq.num_computed = seq_result.num_computed
            if step.is_prompt_chunk:
                continue
            if seq_result.num_drafted:  # the draft cache now holds what the target's does
                seq.draft_synced = seq_result.num_computed
            seq.stats.draft_time_s += result.draft_time_s
            seq.stats.verify_time_s += result.verify_time_s
            outputs.append(self._apply(seq, seq_result, step.num_draft_tokens))
        self._retire()
        return outputs

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

    def _apply(self, seq: Sequence, result: SeqResult, planned_k: int) -> RequestOutput:
        """Account, emit and finish one sequence after its verify."""
        seq.stats.record_round(result.num_drafted, result.num_accepted, planned_k)
        self.stats.record_round(result.num_drafted, result.num_accepted, planned_k)
        new_ids: list[int] = []
        for token in result.new_token_ids:
            new_ids.append(token)
            if token in seq.end_ids:
                seq.finish_reason = FinishReason.STOP
                break
            if len(seq.output_ids) + len(new_ids) >= seq.max_tokens:
                seq.finish_reason = FinishReason.LENGTH
                break
        # the end token is emitted as a token id but its text is not part of the output
        ended = seq.finish_reason is FinishReason.STOP
        kept, text, stopped = seq.text.push(new_ids[:-1] if ended else new_ids)
        if stopped:
            # a stop string completed: drop every token after the one that completed it
            seq.finish_reason = FinishReason.STOP
            new_ids = new_ids[:kept]
        seq.output_ids.extend(new_ids)
        self.stats.generated_tokens += len(new_ids)
        if seq.finished:
            text += seq.text.finish()
        log_probs = None if result.log_probs is None else result.log_probs[: len(new_ids)]
        return self._output(seq, new_ids, text, log_probs)

    def _output(
        self, seq: Sequence, new_ids: list[int], text: str, log_probs: list[float] | None = None
    ) -> RequestOutput:
        if log_probs is None and seq.sampling.return_log_probs:
            log_probs = []
        return RequestOutput(
            seq.seq_id,
            new_ids,
            text,
            seq.finished,
            seq.finish_reason,
            seq.stats,
            seq.error,
            new_log_probs=log_probs,
            num_prompt_tokens=len(seq.prompt_ids),
            first_scheduled_ns=seq.first_scheduled_ns,
        )

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


def _refuse_logits_rules(sampling: SamplingParams) -> None:
    """For a runner that does not apply them: refuse, naming the request field, rather than ignore."""
    defaults = SamplingParams()
    for name, field_name in (
        ("bad_words_ids", "bad_words"),
        ("repetition_penalty", "repetition_penalty"),
        ("presence_penalty", "presence_penalty"),
        ("frequency_penalty", "frequency_penalty"),
        ("min_tokens", "min_tokens"),
        ("return_log_probs", "return_log_probs"),
    ):
        if getattr(sampling, name) != getattr(defaults, name):
            raise InvalidInputError(field_name, "is not supported by this engine (engine.kind trtllm) yet")
