"""The serving loop: one background thread steps the in-flight batcher and streams each request its
newly verified text.

Triton's ``execute()`` only checks a request's fields and ``submit``s it here; it never waits, and the
prompt is tokenised on the loop's thread (a request too long for the context is refused from there,
INVALID_ARG as from ``execute()``). One Triton request may fan out to several sequences (rows of its
batch, ``num_return_sequences``); they share its response sender, each response says which one it is
(``batch_index``, ``sequence_index``), and only the last to end carries the final flag. Every round
the loop checks each live request for cancellation, steps the scheduler once, and sends every
request what that round verified. Nothing here imports Triton: a response sink is anything with
``is_cancelled`` / ``send`` / ``send_error`` (the Triton one lives in ``triton_model``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from trispec.errors import Overloaded
from trispec.llm_engine import LLMEngine
from trispec.scheduler import RequestOutput
from trispec.sequence import FinishReason
from trispec.serving.admin import answer, run_reset
from trispec.serving.heartbeat import Heartbeat
from trispec.serving.live import ErrorKind, Group, Live, ResponseSink, groups
from trispec.serving.tensors import (
    ParsedRequest,
    as_tensor_error,
)
from trispec.stats import EngineStats
from trispec.step import KVUsage

logger = logging.getLogger(__name__)
__all__ = ["ErrorKind", "Heartbeat", "QueueLimits", "ResponseSink", "RoundReport", "ServingLoop"]


@dataclass(frozen=True)
class QueueLimits:
    """Admission bounds (``scheduler.max_waiting`` / ``max_queue_delay_s``; None: unbounded)."""

    max_waiting: int | None = None
    max_queue_delay_s: float | None = None


@dataclass(frozen=True)
class RoundReport:
    """What one loop round did, for metrics."""

    # None for the report made at start, before any round
    latency_s: float | None
    running: int
    waiting: int
    # KV pools by name (target, drafter)
    kv: dict[str, KVUsage]
    # cumulative totals over all requests since start
    engine: EngineStats
    # finish reasons of the requests that ended this round
    finished: list[str] = field(default_factory=list)
    # sequences whose first token came this round: seconds from the request's arrival
    ttft_s: list[float] = field(default_factory=list)
    # sequences of 2+ tokens that ended this round: (last token - first token) / (tokens - 1), seconds
    inter_token_s: list[float] = field(default_factory=list)


class LoopMetrics(Protocol):
    def record(self, report: RoundReport) -> None: ...

    def record_rejection(self, reason: str) -> None: ...

    def record_resumed(self) -> None:
        """A request that resumes a stream the server cut (it carried ``skip_output_tokens``)."""
        ...

    def record_prefix_cache_reset(self) -> None:
        """An operator emptied the prefix cache (``reset_prefix_cache``)."""
        ...


class ServingLoop:
    def __init__(
        self,
        engine: LLMEngine,
        metrics: LoopMetrics | None = None,
        limits: QueueLimits = QueueLimits(),
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.limits = limits
        self.heartbeat = heartbeat
        if limits.max_queue_delay_s is not None:
            # halfway to being refused, a request not started takes the place of one that has
            # streamed as long (scheduler: ``_admit_urgent``)
            engine.admit_urgently_after(limits.max_queue_delay_s / 2)
        self._live: dict[int, Live] = {}
        # operators' resets of the prefix cache waiting for the loop thread, each the sink it answers
        self._resets: list[ResponseSink] = []
        # latencies seen while dispatching this round's outputs, for its report (loop thread only)
        self._ttft_s: list[float] = []
        self._inter_token_s: list[float] = []
        # held while a request is registered, and while a round's outputs are dispatched, so an
        # output never arrives for a request that is not registered yet
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specdec-loop", daemon=True)
        # refusals at max_queue_delay_s on time, not after the step that is running then
        self._expiry = threading.Thread(target=self._expire_loop, name="specdec-expiry", daemon=True)

    # -- called from Triton's threads ------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        if self.limits.max_queue_delay_s is not None:
            self._expiry.start()

    def submit(self, request: ParsedRequest | Sequence[ParsedRequest], sink: ResponseSink) -> list[int]:
        """Queue a request: one ``ParsedRequest`` per row of its batch, each fanning out to its
        ``num_return_sequences``. Raises ``InvalidInputError`` naming the field, or ``Overloaded`` when
        the waiting queue cannot take them all; nothing is queued then. Returns the sequences' ids."""
        rows = [request] if isinstance(request, ParsedRequest) else list(request)
        sequences = [
            (row, batch_index, sequence_index, generation)
            for batch_index, row in enumerate(rows)
            for sequence_index, generation in enumerate(row.sequences())
        ]
        # the words of the retryable refusals ("... retry later", "the model is shutting down") are
        # how clients recognise them: Triton's HTTP generate answers every model error with 400 and a
        # gRPC stream error has no status (trispec_client.errors, docs/serving-errors.md)
        if self._stopping.is_set():
            raise Overloaded("shutting_down", "the model is shutting down")
        queued, limit = len(self.engine.queued_request_ids()), self.limits.max_waiting
        if limit is not None and queued + len(sequences) > limit:
            raise Overloaded(
                "queue_full",
                f"{queued} requests are waiting for a slot (scheduler.max_waiting {limit}) and this one "
                f"brings {len(sequences)}; retry later",
            )
        for row in rows:  # a guide compiles (or is refused) before the loop's lock is taken
            self.engine.compile_guide(row.generation)
        group = Group(sink, remaining=len(sequences))
        with self._lock:
            try:
                for row, batch_index, sequence_index, generation in sequences:
                    # tokenised by the loop thread: Triton's thread only hands the request over
                    request_id = self.engine.add_request(generation, tokenize_later=True)
                    group.request_ids.append(request_id)
                    seed = None if generation.sampling.greedy else generation.seed
                    self._live[request_id] = Live(group, row, batch_index, sequence_index, seed=seed)
            except Exception:
                for request_id in group.request_ids:  # all or nothing
                    del self._live[request_id]
                    self.engine.cancel(request_id)
                raise
        self._wake.set()
        if self.metrics is not None and any(row.resumed for row in rows):
            try:
                self.metrics.record_resumed()
            except Exception:
                logger.exception("recording a resumed stream failed")
        return group.request_ids

    def reset_prefix_cache(self, sink: ResponseSink) -> None:
        """Queue an operator's reset of the prefix cache (``serving/admin.py``): the loop thread runs
        it before its next step, never during one, and answers ``sink`` once."""
        if self._stopping.is_set():
            raise Overloaded("shutting_down", "the model is shutting down")
        with self._lock:
            self._resets.append(sink)
        self._wake.set()

    def reject(self, reason: str, request_id: str, message: str) -> None:
        """Account a refused request: one INFO line (never the prompt) and the metric."""
        logger.info("refused request %s (%s): %s", request_id or "-", reason, message)
        if self.metrics is not None:
            try:
                self.metrics.record_rejection(reason)
            except Exception:
                logger.exception("recording a rejection failed")

    def num_live(self) -> int:
        with self._lock:
            return len(self._live)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread; requests still live get an error response that ends them."""
        self._stopping.set()
        self._wake.set()
        for thread in (self._thread, self._expiry):
            if thread.is_alive():
                thread.join(timeout_s)
        if self.heartbeat is not None:
            self.heartbeat.remove()
        with self._lock:
            live, self._live = self._live, {}
            resets, self._resets = self._resets, []
        for group in groups(live.values()):
            self._send_error(group, "the model is shutting down", "unavailable")
        for sink in resets:
            answer(sink, ("the model is shutting down", "unavailable"))

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        if self.metrics is not None:
            self._record(None, [])  # gauges show the idle state before the first request
        while not self._stopping.is_set():
            if self.heartbeat is not None:
                self.heartbeat.beat()
            if self._resets:
                self._reset_prefix_cache()
            if not self.engine.has_work():
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            self._check_cancellations()
            start = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a bug, not a per-request failure (those come back as outputs)
                logger.exception("scheduler step failed")
                self._fail_all(f"internal error: {type(exc).__name__}: {exc}")
                continue
            latency = time.perf_counter() - start
            finished = self._dispatch(outputs)
            if self.metrics is not None:
                self._record(latency, finished)

    def _reset_prefix_cache(self) -> None:
        """Run the queued resets at once (one is as good as several) and answer each."""
        with self._lock:
            sinks, self._resets = self._resets, []
        outcome = run_reset(self.engine)
        if isinstance(outcome, dict) and self.metrics is not None:
            try:
                self.metrics.record_prefix_cache_reset()
            except Exception:
                logger.exception("recording a prefix-cache reset failed")
            self._record(None, [])  # the pools' gauges at once, busy or idle
        for sink in sinks:
            answer(sink, outcome)

    def _check_cancellations(self) -> None:
        with self._lock:
            live = dict(self._live)
        for group in groups(live.values()):
            try:
                cancelled = group.sink.is_cancelled()
            except Exception:  # the sender is gone: nobody is listening any more
                cancelled = True
            if cancelled:  # every live sequence of the request ends (each with its final response)
                for request_id in group.request_ids:
                    if request_id in live:
                        self.engine.cancel(request_id)

    def _expire_loop(self, interval_s: float = 0.05) -> None:
        while not self._stopping.wait(interval_s):
            try:
                self._expire_waiting()
            except Exception:  # never let refusing on time stop; the next tick tries again
                logger.exception("expiring waiting requests failed")

    def _expire_waiting(self) -> None:
        """Refuse (retryable) every request that waited for a slot longer than max_queue_delay_s.
        Only one a step has passed over: one that arrived during a long step gets its chance at the
        next (a loaded machine's step may outlast the delay with free slots)."""
        delay = self.limits.max_queue_delay_s
        if delay is None:
            return
        passed_over = self.engine.passed_over_request_ids()
        if not passed_over:  # the common tick: nothing waits for a slot
            return
        now = time.monotonic()
        queued = self.engine.queued_request_ids()
        expired: list[tuple[int, Group]] = []
        with self._lock:
            for request_id in passed_over:
                state = self._live.get(request_id)
                if state is not None and not state.group.ended and now - state.submitted_at > delay:
                    # the whole request is refused: its other sequences too
                    self._drop(state.group)
                    expired.append((request_id, state.group))
        for request_id, group in expired:
            message = (
                f"no slot within scheduler.max_queue_delay_s ({delay:g} s); {len(queued)} requests were "
                "waiting; retry later"
            )
            self.reject("queue_timeout", str(request_id), message)
            self._send_error(group, message, "unavailable")

    def _dispatch(self, outputs: list[RequestOutput]) -> list[str]:
        finished = []
        with self._lock:
            for out in outputs:
                state = self._live.get(out.request_id)
                if state is None:
                    continue
                group = state.group
                if out.invalid is not None:  # refused once tokenised: not a request that ran
                    self._drop(group)
                    error = as_tensor_error(out.invalid)
                    self.reject(out.invalid.reason, str(out.request_id), str(error))
                    self._send_error(group, str(error), "invalid")
                    continue
                if out.finished:
                    del self._live[out.request_id]
                    group.remaining -= 1
                    finished.append(out.finish_reason.value if out.finish_reason else "unknown")
                if out.finish_reason is FinishReason.ERROR:
                    self._drop(group)
                    self._send_error(group, f"generation failed: {out.error}")
                    continue
                try:
                    self._respond(state, out)
                except Exception as exc:
                    logger.exception("sending a response for request %d failed", out.request_id)
                    self._drop(group)
                    # the request still needs its one final response, or its client (a gRPC stream
                    # waiting to close, an HTTP reply) waits forever; if the sender is the broken
                    # part this fails too, and _send_error logs it
                    self._send_error(group, f"internal error: sending a response failed: {exc}")
        return finished

    def _drop(self, group: Group) -> None:
        """End a request early (caller holds the lock): its sequences leave the batch, nothing more is
        sent but the one error response the caller sends."""
        group.ended = True
        for request_id in group.request_ids:
            if self._live.pop(request_id, None) is not None:
                self.engine.cancel(request_id)

    def _respond(self, state: Live, out: RequestOutput) -> None:
        now = time.time_ns()
        if out.new_token_ids and not state.first_token_ns and self.metrics is not None:
            self._ttft_s.append((now - state.arrival_ns) / 1e9)
        response = state.take(out, now)
        if out.finished and state.token_count > 1 and self.metrics is not None:
            self._inter_token_s.append(
                (state.last_token_ns - state.first_token_ns) / 1e9 / (state.token_count - 1)
            )
        if response is not None:
            # the final flag closes the whole request: only with its last sequence
            state.sink.send(response, out.finished and state.group.remaining == 0)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            live, self._live = self._live, {}
        for request_id in live:
            self.engine.cancel(request_id)
        for group in groups(live.values()):
            self._send_error(group, message)

    @staticmethod
    def _send_error(group: Group, message: str, kind: ErrorKind = "internal") -> None:
        group.ended = True
        try:
            group.sink.send_error(message, kind)
        except Exception:
            logger.exception("sending an error response failed")

    def _record(self, latency_s: float | None, finished: list[str]) -> None:
        engine = self.engine
        report = RoundReport(
            latency_s=latency_s,
            running=engine.num_running,
            waiting=engine.num_waiting,
            kv=engine.kv_usage(),
            engine=engine.stats,
            finished=finished,
            ttft_s=self._ttft_s,
            inter_token_s=self._inter_token_s,
        )
        self._ttft_s, self._inter_token_s = [], []
        try:
            self.metrics.record(report)  # type: ignore[union-attr]
        except Exception:
            logger.exception("recording metrics failed")
