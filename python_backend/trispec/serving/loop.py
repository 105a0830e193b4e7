"""The serving loop: one background thread steps the in-flight batcher and streams each request its
newly verified text.

Triton's ``execute()`` only checks a request's fields and ``submit``s it here; it never waits, and the
prompt is tokenised on the loop's thread (a request too long for the context is refused from there,
INVALID_ARG as from ``execute()``). Every round
the loop checks each live request for cancellation, steps the scheduler once, and sends every
request what that round verified. Nothing here imports Triton: a response sink is anything with
``is_cancelled`` / ``send`` / ``send_error`` (the Triton one lives in ``triton_model``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from trispec.errors import Overloaded
from trispec.llm_engine import LLMEngine
from trispec.scheduler import RequestOutput
from trispec.sequence import FinishReason
from trispec.serving.tensors import ParsedRequest, as_tensor_error, response_tensors
from trispec.stats import EngineStats
from trispec.step import KVUsage

logger = logging.getLogger(__name__)


# what an error response says to the client: Triton's INTERNAL, INVALID_ARG (HTTP 400) or
# UNAVAILABLE (HTTP 503, gRPC UNAVAILABLE: retry later or elsewhere)
ErrorKind = Literal["internal", "invalid", "unavailable"]


class ResponseSink(Protocol):
    """Where one request's responses go."""

    def is_cancelled(self) -> bool: ...

    def send(self, tensors: dict[str, np.ndarray], final: bool) -> None: ...

    def send_error(self, message: str, kind: ErrorKind = "internal") -> None:
        """An error response that also ends the request."""
        ...


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


class LoopMetrics(Protocol):
    def record(self, report: RoundReport) -> None: ...

    def record_rejection(self, reason: str) -> None: ...


@dataclass
class _Live:
    sink: ResponseSink
    prompt: str
    stream: bool
    exclude_input_in_output: bool
    submitted_at: float = field(default_factory=time.monotonic)
    text: str = ""  # accumulated for stream=false
    token_count: int = 0


class Heartbeat:
    """A file whose mtime the loop thread renews at most every ``interval_s``, once per round and
    every 0.1 s when idle: the supervisor restarts the server when it stands still for long while the
    stub runs (a stuck loop would otherwise hang its requests while /v2/health/ready says 200)."""

    def __init__(self, path: Path, interval_s: float = 0.5) -> None:
        self.path = path
        self.interval_s = interval_s
        self._last = float("-inf")
        self._failed = False

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self.path.touch()
        except OSError as exc:  # never fatal to serving; said once
            if not self._failed:
                logger.warning("cannot renew the heartbeat file %s: %s", self.path, exc)
            self._failed = True

    def remove(self) -> None:
        """A loop stopped on purpose is not stuck: take its heartbeat away."""
        self.path.unlink(missing_ok=True)


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
        self._live: dict[int, _Live] = {}
        # held while a request is registered, and while a round's outputs are dispatched, so an
        # output never arrives for a request that is not registered yet
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specdec-loop", daemon=True)

    # -- called from Triton's threads ------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, request: ParsedRequest, sink: ResponseSink) -> int:
        """Queue a request. Raises ``InvalidInputError`` naming the field, or ``Overloaded`` when the
        waiting queue is full; nothing is queued then."""
        if self._stopping.is_set():
            raise Overloaded("shutting_down", "the model is shutting down")
        queued, limit = len(self.engine.queued_request_ids()), self.limits.max_waiting
        if limit is not None and queued >= limit:
            raise Overloaded(
                "queue_full",
                f"{queued} requests are waiting for a slot (scheduler.max_waiting {limit}); retry later",
            )
        with self._lock:
            # tokenised by the loop thread: Triton's thread only hands the request over
            request_id = self.engine.add_request(request.generation, tokenize_later=True)
            self._live[request_id] = _Live(
                sink, request.generation.prompt, request.stream, request.exclude_input_in_output
            )
        self._wake.set()
        return request_id

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
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self.heartbeat is not None:
            self.heartbeat.remove()
        with self._lock:
            live, self._live = self._live, {}
        for state in live.values():
            self._send_error(state, "the model is shutting down", "unavailable")

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        if self.metrics is not None:
            self._record(None, [])  # gauges show the idle state before the first request
        while not self._stopping.is_set():
            if self.heartbeat is not None:
                self.heartbeat.beat()
            if not self.engine.has_work():
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            self._check_cancellations()
            self._expire_waiting()
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

    def _check_cancellations(self) -> None:
        with self._lock:
            live = list(self._live.items())
        for request_id, state in live:
            try:
                cancelled = state.sink.is_cancelled()
            except Exception:  # the sender is gone: nobody is listening any more
                cancelled = True
            if cancelled:
                self.engine.cancel(request_id)

    def _expire_waiting(self) -> None:
        """Refuse (retryable) every request that waited for a slot longer than max_queue_delay_s."""
        delay = self.limits.max_queue_delay_s
        if delay is None:
            return
        now = time.monotonic()
        queued = self.engine.queued_request_ids()
        expired = []
        with self._lock:
            for request_id in queued:
                state = self._live.get(request_id)
                if state is not None and now - state.submitted_at > delay:
                    expired.append((request_id, self._live.pop(request_id)))
        for request_id, state in expired:
            self.engine.cancel(request_id)
            message = (
                f"no slot within scheduler.max_queue_delay_s ({delay:g} s); {len(queued)} requests were "
                "waiting; retry later"
            )
            self.reject("queue_timeout", str(request_id), message)
            self._send_error(state, message, "unavailable")

    def _dispatch(self, outputs: list[RequestOutput]) -> list[str]:
        finished = []
        with self._lock:
            for out in outputs:
                state = self._live.get(out.request_id)
                if state is None:
                    continue
                if out.invalid is not None:  # refused once tokenised: not a request that ran
                    del self._live[out.request_id]
                    error = as_tensor_error(out.invalid)
                    self.reject(out.invalid.reason, str(out.request_id), str(error))
                    self._send_error(state, str(error), "invalid")
                    continue
                if out.finished:
                    del self._live[out.request_id]
                    finished.append(out.finish_reason.value if out.finish_reason else "unknown")
                try:
                    self._respond(state, out)
                except Exception:
                    logger.exception("sending a response for request %d failed", out.request_id)
                    if not out.finished:
                        del self._live[out.request_id]
                        self.engine.cancel(out.request_id)
        return finished

    @staticmethod
    def _respond(state: _Live, out: RequestOutput) -> None:
        state.token_count += len(out.new_token_ids)
        if out.finish_reason is FinishReason.ERROR:
            state.sink.send_error(f"generation failed: {out.error}")
            return
        reason = out.finish_reason.value if out.finish_reason else None
        if state.stream:
            if out.finished:
                state.sink.send(response_tensors(out.new_text, state.token_count, reason, out.stats), True)
            elif out.new_text:
                state.sink.send(response_tensors(out.new_text, state.token_count), False)
            return
        state.text += out.new_text
        if out.finished:
            text = state.text if state.exclude_input_in_output else state.prompt + state.text
            state.sink.send(response_tensors(text, state.token_count, reason, out.stats), True)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            live, self._live = self._live, {}
        for request_id, state in live.items():
            self.engine.cancel(request_id)
            self._send_error(state, message)

    @staticmethod
    def _send_error(state: _Live, message: str, kind: ErrorKind = "internal") -> None:
        try:
            state.sink.send_error(message, kind)
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
        )
        try:
            self.metrics.record(report)  # type: ignore[union-attr]
        except Exception:
            logger.exception("recording metrics failed")
