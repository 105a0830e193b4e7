"""One live request on the serving loop: its response sender and sequences (``Group``), and each
sequence's state between rounds (``Live``): what was verified but not yet reported, the skipped text
of a resumed stream, and the response one round's output makes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from trispec.scheduler import RequestOutput
from trispec.serving.tensors import ParsedRequest, PerfMetrics, response_tensors, skipped_digest
from trispec.step import PromptLogProbs, TokenAlternatives

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


@dataclass(eq=False)
class Group:
    """One Triton request: its response sender and the sequences it fans out to."""

    sink: ResponseSink
    request_ids: list[int] = field(default_factory=list)
    # sequences not finished yet: the one that brings this to 0 sends the final flag
    remaining: int = 0
    # ended by an error: nothing more is sent
    ended: bool = False


@dataclass(eq=False)
class Live:
    """One sequence of a request."""

    group: Group
    request: ParsedRequest
    batch_index: int = 0
    sequence_index: int = 0
    submitted_at: float = field(default_factory=time.monotonic)
    arrival_ns: int = field(default_factory=time.time_ns)
    first_token_ns: int = 0
    last_token_ns: int = 0
    text: str = ""  # accumulated for stream=false
    token_count: int = 0
    # tokens (and their log probs) not yet reported: streamed text can lag its tokens (a multi-byte
    # character, a possible stop string), and a one-shot response reports them all at the end
    pending_tokens: int = 0
    pending_log_probs: list[float] = field(default_factory=list)
    pending_top_log_probs: list[TokenAlternatives] = field(default_factory=list)
    # the prompt's scores, until the first response carries them
    pending_prompt_log_probs: PromptLogProbs | None = None
    cum_log_prob: float = 0.0
    # a sampled sequence's seed, sent once with its first response (sampling_seed)
    seed: int | None = None
    # the text of the tokens within skip_output_tokens: not sent, its digest is (skipped_text_sha256)
    skipped_text: str = ""
    responded: bool = False

    @property
    def sink(self) -> ResponseSink:
        return self.group.sink

    def _alternatives(self) -> tuple[int, list[TokenAlternatives]] | None:
        count = self.request.generation.top_log_probs
        return (count, self.pending_top_log_probs) if count else None

    def _prompt_scores(self) -> tuple[int, PromptLogProbs] | None:
        scores = self.pending_prompt_log_probs
        return None if scores is None else (self.request.generation.top_log_probs, scores)

    def take(self, out: RequestOutput, now_ns: int) -> dict[str, np.ndarray] | None:
        """Account one round's output; the response tensors to send now, or None (nothing to show
        yet: its tokens are reported with the next text)."""
        request = self.request
        if out.new_token_ids:
            self.first_token_ns = self.first_token_ns or now_ns
            self.last_token_ns = now_ns
        # tokens within skip_output_tokens (a resumed stream) are counted, never sent
        to_skip = request.generation.skip_output_tokens - self.token_count
        skipped = max(0, min(len(out.new_token_ids), to_skip))
        self.skipped_text += out.skipped_text
        self.token_count += len(out.new_token_ids)
        self.pending_tokens += len(out.new_token_ids) - skipped
        if out.new_log_probs is not None:
            self.pending_log_probs.extend(out.new_log_probs[skipped:])
            self.cum_log_prob += math.fsum(out.new_log_probs)
        if out.new_top_log_probs is not None:
            self.pending_top_log_probs.extend(out.new_top_log_probs[skipped:])
        if out.prompt_log_probs is not None and not self.responded:
            self.pending_prompt_log_probs = out.prompt_log_probs
        if request.stream:
            if not out.finished and not out.new_text:
                return None
            text = out.new_text
        else:
            self.text += out.new_text
            if not out.finished:
                return None
            text = self.text if request.exclude_input_in_output else request.generation.prompt + self.text
        final = out.finished
        perf = None
        if request.return_perf_metrics:
            perf = PerfMetrics(
                arrival_ns=self.arrival_ns,
                first_scheduled_ns=out.first_scheduled_ns or 0,
                first_token_ns=self.first_token_ns,
                last_token_ns=self.last_token_ns,
                kv=out.kv_metrics,
            )
        tensors = response_tensors(
            text,
            self.token_count,
            out.finish_reason.value if final and out.finish_reason else None,
            out.stats if final or perf is not None else None,
            batch_index=self.batch_index,
            sequence_index=self.sequence_index,
            log_probs=self.pending_log_probs if request.generation.return_log_probs else None,
            cum_log_prob=self.cum_log_prob,
            top_log_probs=self._alternatives(),
            prompt_log_probs=self._prompt_scores(),
            perf=perf,
            num_input_tokens=out.num_prompt_tokens if request.return_num_input_tokens else None,
            num_output_tokens=self.pending_tokens if request.return_num_output_tokens else None,
            seed=None if self.responded else self.seed,
            skipped_text_sha256=None if self.responded else skipped_digest(request, self.skipped_text),
            model_fingerprint=None if self.responded else request.model_fingerprint,
            cached_tokens=out.cached_tokens,
        )
        self.pending_tokens, self.pending_log_probs, self.responded = 0, [], True
        self.pending_top_log_probs, self.pending_prompt_log_probs = [], None
        return tensors


def groups(states: Iterable[Live]) -> list[Group]:
    """The distinct requests of some sequences, in order."""
    return list({id(state.group): state.group for state in states}.values())
