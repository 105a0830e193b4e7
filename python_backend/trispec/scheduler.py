"""The speculative step loop with in-flight batching.

One ``step()``:
  1. take in new requests and cancellations (thread-safe inbox: a server thread feeds it);
  2. admit waiting requests while the batch and both KV budgets have room;
  3. plan prompt prefill under the per-step token budget (long prompts go in chunks);
  4. draft for every ready sequence (batched per draft position);
  5. verify all drafts, and the prefill chunks, in ONE batched target pass;
  6. per sequence: accept, roll both caches back, emit verified tokens, retire finished ones.

If the batched round raises, it is undone and rerun one sequence at a time: only a sequence that
fails on its own finishes with ``error``; the others carry on.

``num_draft_tokens`` 0 is plain decoding through the same loop.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from trispec.accept import AcceptResult
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter, DraftProposal, DraftRequest
from trispec.engine.base import ForwardInput
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest, Limits, validate_request
from trispec.sampling import make_generator
from trispec.sequence import FinishReason, Sequence
from trispec.speculation import SpeculationController
from trispec.stats import AcceptanceStats, EngineStats
from trispec.verifier import Verifier, VerifyInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: only verified tokens, and text safe to show."""

    request_id: int
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    stats: AcceptanceStats
    # why the request failed (finish_reason ERROR): the engine raised for this sequence alone
    error: str | None = None


class Scheduler:
    def __init__(
        self,
        verifier: Verifier,
        drafter: Drafter | None,
        config: SchedulerConfig,
        *,
        encode: Callable[[str], list[int]],
        make_text_tracker: Callable[[list[str]], StopTextTracker],
        eos_ids: frozenset[int],
    ) -> None:
        self.verifier = verifier
        self.drafter = drafter
        self.config = config
        self.encode = encode
        self.make_text_tracker = make_text_tracker
        self.eos_ids = eos_ids
        max_k = config.max_num_draft_tokens if drafter is not None else 0
        max_context = verifier.max_context
        if config.max_context is not None:
            max_context = min(max_context, config.max_context)
        self.limits = Limits(
            max_context=max_context,
            max_num_draft_tokens=max_k,
            default_num_draft_tokens=min(config.default_num_draft_tokens, max_k),
            vocab_size=verifier.vocab_size,
        )
        self.stats = EngineStats()
        self.controller = SpeculationController() if config.adaptive_speculation and drafter else None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._cancels: set[int] = set()

    # -- called from any thread ------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> int:
        """Validate and queue a request; returns its id. Raises InvalidInputError naming the field."""
        if request.prompt_token_ids is not None:
            prompt_ids = list(request.prompt_token_ids)
        else:
            if not isinstance(request.prompt, str) or not request.prompt:
                raise InvalidInputError("prompt", "must be a non-empty string")
            prompt_ids = self.encode(request.prompt)
        num_draft_tokens = validate_request(request, prompt_ids, self.limits)
        with self._lock:
            seq_id = next(self._ids)
        seq = Sequence(
            seq_id=seq_id,
            prompt_ids=prompt_ids,
            max_tokens=request.max_tokens,
            num_draft_tokens=num_draft_tokens,
            sampling=request.sampling,
            generator=make_generator(request.sampling),
            end_ids=frozenset([request.end_id]) if request.end_id is not None else self.eos_ids,
            text=self.make_text_tracker(list(request.stop)),
        )
        seq.uses_drafter = self.drafter is not None and num_draft_tokens > 0
        with self._lock:
            self._inbox.append(seq)
        return seq_id

    def cancel(self, request_id: int) -> None:
        """Stop a request at the next step; its KV blocks return to the pool."""
        with self._lock:
            self._cancels.add(request_id)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self.waiting or self.running or self._inbox)

    # -- the loop ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self._take_inbox()
        self._admit()
        ready, prefill = self._plan_prefill()
        if not ready and not prefill:
            return outputs
        self.stats.steps += 1
        try:
            outputs += self._round(ready, prefill)
        except Exception as exc:
            outputs += self._isolate_failure(ready, prefill, exc)
        self._retire()
        return outputs

    def _round(
        self, ready: list[Sequence], prefill: list[ForwardInput], measure: bool = True
    ) -> list[RequestOutput]:
        """Draft, verify in one batched target pass, and apply the results (steps 4-6)."""
        speculate = bool(ready) and (self.controller is None or self.controller.choose(len(ready)))
        t0 = time.perf_counter()
        drafts = self._draft(ready, prefill, speculate)
        t1 = time.perf_counter()
        items = [
            VerifyInput(seq.seq_id, seq.token_ids[seq.num_cached :], draft, seq.sampling, seq.generator)
            for seq, draft in zip(ready, drafts)
        ]
        results = self.verifier.verify(items, prefill)
        t2 = time.perf_counter()
        if (
            measure
            and self.controller is not None
            and ready
            and not prefill
            and all(len(i.pending_tokens) == 1 for i in items)
        ):
            # only pure decode steps: prompt work would blur the comparison
            emitted = sum(len(r.tokens) for r in results)
            self.controller.record(len(ready), speculate, emitted, t2 - t0)
        for chunk in prefill:
            self._seq(chunk.seq_id).num_cached += len(chunk.token_ids)
        if ready:
            self.stats.record_verify_batch(len(ready))
        self.stats.draft_time_s += t1 - t0
        self.stats.verify_time_s += t2 - t1
        outputs = []
        for seq, draft, result in zip(ready, drafts, results):
            seq.stats.draft_time_s += t1 - t0
            seq.stats.verify_time_s += t2 - t1
            outputs.append(self._apply(seq, draft, result))
        return outputs

    def _isolate_failure(
        self, ready: list[Sequence], prefill: list[ForwardInput], exc: Exception
    ) -> list[RequestOutput]:
        """A batched round raised: undo it, then rerun each sequence alone so that only the ones
        that fail on their own are failed; the rest of the batch carries on."""
        involved = [*ready, *(self._seq(c.seq_id) for c in prefill)]
        self._undo(involved)
        if len(involved) == 1:
            return [self._fail(involved[0], exc)]
        logger.warning("a batched round of %d sequences failed (%r); retrying one by one", len(involved), exc)
        outputs = []
        alone: list[tuple[list[Sequence], list[ForwardInput]]] = [([s], []) for s in ready]
        alone += [([], [c]) for c in prefill]
        for (seqs, chunks), seq in zip(alone, involved):
            try:
                outputs += self._round(seqs, chunks, measure=False)
            except Exception as seq_exc:
                self._undo([seq])
                outputs.append(self._fail(seq, seq_exc))
        return outputs

    def _undo(self, seqs: list[Sequence]) -> None:
        """Forget anything a failed round put in either cache past the verified tokens."""
        for seq in seqs:
            self.verifier.rollback(seq.seq_id, seq.num_cached)
            if seq.uses_drafter and self.drafter is not None:
                self.drafter.rollback(seq.seq_id, seq.num_cached)

    def _fail(self, seq: Sequence, exc: Exception) -> RequestOutput:
        logger.error("request %d failed: %r", seq.seq_id, exc, exc_info=exc)
        seq.finish_reason = FinishReason.ERROR
        seq.error = f"{type(exc).__name__}: {exc}"
        return self._output(seq, [], "")

    def _take_inbox(self) -> list[RequestOutput]:
        with self._lock:
            self.waiting.extend(self._inbox)
            self._inbox.clear()
            cancels, self._cancels = self._cancels, set()
        outputs = []
        for seq in [*self.waiting, *self.running]:
            if seq.seq_id in cancels:
                seq.finish_reason = FinishReason.CANCELLED
                outputs.append(self._output(seq, [], seq.text.finish()))
        self.waiting = deque(s for s in self.waiting if not s.finished)
        self._retire()
        return outputs

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_batch_size:
            seq = self.waiting[0]
            if not self.verifier.can_admit(seq.max_length):
                break
            if seq.uses_drafter and self.drafter is not None and not self.drafter.can_admit(seq.max_length):
                break
            self.waiting.popleft()
            self.verifier.add_sequence(seq.seq_id, seq.max_length)
            if seq.uses_drafter and self.drafter is not None:
                self.drafter.add_sequence(seq.seq_id, seq.max_length)
            self.running.append(seq)

    def _plan_prefill(self) -> tuple[list[Sequence], list[ForwardInput]]:
        """Ready sequences verify this step (their uncached prompt tail rides along with the
        pending token); others get a prompt chunk within the per-step token budget."""
        budget = self.config.max_prefill_tokens_per_step
        ready, prefill = [], []
        for seq in self.running:
            extra = seq.num_tokens - seq.num_cached - 1  # prompt tokens beyond the one pending token
            if extra <= budget:
                budget -= extra
                self.stats.prefill_tokens += extra
                ready.append(seq)
            elif budget > 0:
                chunk = seq.token_ids[seq.num_cached : seq.num_cached + budget]
                self.stats.prefill_tokens += budget
                budget = 0
                prefill.append(ForwardInput(seq.seq_id, chunk, 0))
        return ready, prefill

    def _draft(
        self, ready: list[Sequence], prefill: list[ForwardInput], speculate: bool
    ) -> list[DraftProposal]:
        drafts = [DraftProposal([]) for _ in ready]
        if self.drafter is None:
            return drafts
        self.drafter.prefill([c for c in prefill if self._seq(c.seq_id).uses_drafter])
        # a seeded sampled request always drafts its own k: its random draws, hence its output,
        # depend on k, and the seed promises the same output on every run
        index = [i for i, seq in enumerate(ready) if seq.uses_drafter and (speculate or seq.seeded_sampling)]
        requests = [
            DraftRequest(
                seq_id=ready[i].seq_id,
                token_ids=ready[i].token_ids,
                # never draft past max_tokens: the last round needs room for the target's own token
                num_draft_tokens=min(ready[i].num_draft_tokens, ready[i].remaining_tokens - 1),
                sampling=ready[i].sampling,
                generator=ready[i].generator,
            )
            for i in index
        ]
        for i, proposal in zip(index, self.drafter.propose(requests)):
            drafts[i] = proposal
        return drafts

    def _apply(self, seq: Sequence, draft: DraftProposal, result: AcceptResult) -> RequestOutput:
        """Account, emit and finish one sequence after its verify."""
        seq.stats.record_round(len(draft.tokens), result.num_accepted)
        self.stats.record_round(len(draft.tokens), result.num_accepted)
        seq.num_cached = seq.num_tokens + result.num_accepted
        new_ids: list[int] = []
        for token in result.tokens:
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
        if seq.uses_drafter and self.drafter is not None:
            self.drafter.rollback(seq.seq_id, seq.num_cached)
        if seq.finished:
            text += seq.text.finish()
        return self._output(seq, new_ids, text)

    def _output(self, seq: Sequence, new_ids: list[int], text: str) -> RequestOutput:
        return RequestOutput(seq.seq_id, new_ids, text, seq.finished, seq.finish_reason, seq.stats, seq.error)

    def _retire(self) -> None:
        for seq in self.running:
            if seq.finished:
                self.verifier.free(seq.seq_id)
                if seq.uses_drafter and self.drafter is not None:
                    self.drafter.free(seq.seq_id)
                self.stats.requests_finished += 1
        self.running = [s for s in self.running if not s.finished]

    def _seq(self, seq_id: int) -> Sequence:
        return next(s for s in self.running if s.seq_id == seq_id)
