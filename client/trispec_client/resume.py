"""Resuming a stream the server cut (its Python stub or tritonserver died, and the supervisor restarted
it): nothing the caller already has is lost, and nothing else is ever spliced into it.

The model's outputs are deterministic: a greedy request, and a sampled request with a seed, give the
same tokens whatever else shares the batch (docs/determinism.md), and the server returns the seed of
every sampled request in its first response (``sampling_seed``; chosen by the server when the request
had none). So a cut stream is sent again with that seed and ``skip_output_tokens`` = the tokens
already delivered: the server generates them again without sending their text, and confirms what it
skipped with the SHA-256 of that text (``skipped_text_sha256``). Only if it equals the text delivered
so far does the stream carry on; otherwise the request ends with :class:`SpecDecResumeError`.

Another replica may take the resumed request, but only one serving the same model: the first response
says which model produced the text (``model_fingerprint``), the re-sent request names it
(``expected_model_fingerprint``) and a replica serving another refuses it; a resumed stream whose
first response names another model is not continued either. Two models never share one text.

Both the synchronous client (``client.py``) and the OpenAI endpoint (``trispec_openai``) drive this
state; what waits and re-sends is theirs.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from trispec_client.errors import (
    INVALID_ARGUMENT,
    UNAVAILABLE,
    InvalidRequestError,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecResumeError,
    SpecDecTimeoutError,
)
from trispec_client.request import GenerationRequest
from trispec_client.results import StreamChunk

# how long to wait, per resume, for the model to be ready again and the re-sent stream to start
DEFAULT_RESUME_TIMEOUT_S = 60.0
# most resumes of one request: a server that keeps dying is not waited for forever
MAX_RESUMES = 5
# pauses between readiness probes / re-sends: 0.25 s, doubling, at most 2 s (each between half and all)
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 2.0

# What a stream cut by the server looks like when it arrives without a status code (a gRPC stream
# error is a bare message; Triton 2.51's HTTP generate answers every model error with 400):
# - gRPC: the call broke ("Stream removed", "Socket closed", "Connection reset", an RST_STREAM);
# - Triton, once the Python stub died: "Stub process 'specdec_0_0' is not healthy." (until the
#   supervisor restarts the server, ready still says 200 and every request fails so);
# - the specdec model stopping ("the model is shutting down");
# - HTTP: the connection broke in the middle of the event stream.
_CUT = re.compile(
    r"stream removed|socket closed|connection reset|connection aborted|broken pipe|rst_stream"
    r"|goaway|is not healthy|the model is shutting down|incompleteread|response ended prematurely"
    r"|connection broken|ended without a final response|server disconnected",
    re.IGNORECASE,
)
# ... and what says the request never reached a server: not a cut stream (a wrong address must not
# make the client wait for a server to come up)
_NEVER_SENT = re.compile(
    r"failed to connect|connection refused|name or service not known|no route to host"
    r"|newconnectionerror|name resolution|dns resolution",
    re.IGNORECASE,
)


def text_digest(text: str) -> str:
    """What ``skipped_text_sha256`` carries for ``text``: the SHA-256 of its UTF-8 bytes, in hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def looks_cut(message: str) -> bool:
    """Whether an error's message says the server cut the stream (or is restarting)."""
    return bool(_CUT.search(message)) and not _NEVER_SENT.search(message)


def is_cut(error: SpecDecError, *, started: bool, reached: bool = False) -> bool:
    """A failure worth resuming: the server went away or is restarting. ``started``: this request is
    known to have reached a server (a chunk arrived, or this is already a resume): then any
    UNAVAILABLE is (a refusal for now included: the restarted server may be busy). ``reached``: the
    same client had a response from this server before: then a refused connection means it is
    restarting. Otherwise an address that cannot be reached is the caller's problem and fails as it
    always did, and a refusal for now is retried (``retries``) and then raised, as ever."""
    if isinstance(error, SpecDecResumeError | SpecDecTimeoutError | InvalidRequestError):
        return False
    if error.status == INVALID_ARGUMENT:
        return False
    if looks_cut(error.message):
        return True
    never_sent = bool(_NEVER_SENT.search(error.message))
    if started:
        return error.status == UNAVAILABLE or error.http_status == 503 or never_sent
    return reached and never_sent


def pauses(initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S) -> Iterator[float]:
    """Back-off between readiness probes: growing pauses with jitter, never longer than ``max_s``."""
    pause = initial_s
    while True:
        yield pause * random.uniform(0.5, 1.0)
        pause = min(pause * 2, max_s)


def wait_until_ready(
    ready: Callable[[float], bool],
    cut_at: float,
    timeout_s: float,
    waits: Iterator[float],
    cause: SpecDecError,
) -> None:
    """Probe ``ready(probe timeout)`` after each of the growing pauses ``waits`` until it says so;
    ``SpecDecConnectionError`` once ``timeout_s`` after ``cut_at`` (``time.monotonic()``) would pass."""
    until = cut_at + timeout_s
    while True:
        left = until - time.monotonic()
        if left <= 0:
            raise SpecDecConnectionError(
                f"the stream was cut ({cause.message}) and the model was not ready again within "
                f"{timeout_s:g} s"
            ) from cause
        time.sleep(min(next(waits), left))
        if ready(min(2.0, max(until - time.monotonic(), 0.1))):
            return


class StreamResume:
    """One request's delivered text, token count and seed, and the checks a resumed stream must pass.

    ``request()`` is what to send now: the request as given, then (after ``cut()``) the same request
    with the seed the server reported and ``skip_output_tokens`` = tokens delivered so far.
    ``take(chunk)`` checks and records each chunk of the current attempt and returns it for delivery
    (the final one carries ``stats.resumed``).
    """

    def __init__(self, request: GenerationRequest, max_resumes: int = MAX_RESUMES) -> None:
        self.original = request
        self.max_resumes = max_resumes
        self.text = ""
        self.token_count = 0
        self.seed = request.seed
        # the model the stream began on (from its first response; None from servers without it)
        self.fingerprint: str | None = None
        self.resumed = 0
        # the current attempt skips tokens: its first chunk must confirm them
        self._to_confirm: int | None = None
        # the current attempt has delivered a chunk (a cut after that is a new resume)
        self.attempt_started = False

    @property
    def started(self) -> bool:
        """The request is known to have reached a server."""
        return self.attempt_started or self.resumed > 0

    def request(self) -> GenerationRequest:
        if self.resumed == 0:
            return self.original
        return replace(
            self.original,
            seed=self.seed,
            skip_output_tokens=self.token_count,
            expected_model_fingerprint=self.fingerprint,
        )

    def cut(self, error: SpecDecError) -> None:
        """The current attempt was cut by ``error``: the next ``request()`` resumes. Counts a resume
        only once per cut stream (a re-send that fails before its first chunk is the same resume)."""
        if self.attempt_started or self.resumed == 0:
            if self.resumed >= self.max_resumes:
                raise SpecDecResumeError(
                    f"the stream was cut {self.resumed + 1} times; not resuming again (last: {error})"
                ) from error
            self.resumed += 1
        self.attempt_started = False
        self._to_confirm = self.token_count

    def refused(self, error: SpecDecError) -> SpecDecResumeError:
        """The re-sent request was refused as invalid (the server cannot resume exactly, or knows no
        ``skip_output_tokens``): the stream cannot go on."""
        return SpecDecResumeError(
            f"the stream was cut after {self.token_count} tokens and cannot be resumed: {error.message}"
        )

    def take(self, chunk: StreamChunk) -> StreamChunk:
        if chunk.seed is not None:
            if self.seed is not None and chunk.seed != self.seed:
                raise SpecDecResumeError(
                    f"the resumed stream samples with seed {chunk.seed}, not {self.seed}: its text would "
                    "not continue the one delivered"
                )
            self.seed = chunk.seed
        self._check_model(chunk)
        if self._to_confirm is not None:
            self._confirm(chunk, self._to_confirm)
            self._to_confirm = None
        self.attempt_started = True
        self.text += chunk.text
        self.token_count = chunk.token_count
        if self.resumed and chunk.final:
            stats = chunk.stats
            return replace(chunk, stats=None if stats is None else replace(stats, resumed=self.resumed))
        return chunk

    def _check_model(self, chunk: StreamChunk) -> None:
        """The first chunk of each attempt names the model that produced it: the same one, always."""
        if self.fingerprint is None:
            self.fingerprint = chunk.model_fingerprint
            return
        if self._to_confirm is None:
            return  # not an attempt's first chunk
        if chunk.model_fingerprint != self.fingerprint:
            raise SpecDecResumeError(
                f"the resumed stream comes from a replica serving model fingerprint "
                f"{chunk.model_fingerprint or 'unknown'}, not {self.fingerprint} (the one it began on): "
                "not resuming, so that no text spliced from two models is delivered"
            )

    def _confirm(self, chunk: StreamChunk, skipped: int) -> None:
        """The first chunk of a resumed stream: it skipped ``skipped`` tokens, whose text must be the
        text delivered so far, byte for byte."""
        if skipped == 0:
            return
        if chunk.skipped_text_sha256 is None:
            raise SpecDecResumeError(
                f"the resumed stream did not confirm the {skipped} tokens it skipped (a server without "
                "skipped_text_sha256): not resuming"
            )
        if chunk.skipped_text_sha256 != text_digest(self.text) or chunk.token_count < skipped:
            raise SpecDecResumeError(
                f"the resumed stream differs from the one cut after {skipped} tokens (its first "
                f"{skipped} tokens are not the {len(self.text)} characters delivered): not resuming, "
                "so that no spliced text is delivered"
            )


def is_other_model(error: SpecDecError) -> bool:
    """A re-sent request refused because that replica serves another model (another fingerprint)."""
    return error.message.lstrip().startswith("expected_model_fingerprint:")


def refusal_of_resend(error: SpecDecError) -> bool:
    """A re-sent request refused as invalid: resuming is impossible, not just delayed."""
    return isinstance(error, InvalidRequestError) or error.status == INVALID_ARGUMENT


__all__ = [
    "DEFAULT_RESUME_TIMEOUT_S",
    "MAX_RESUMES",
    "SpecDecResumeError",
    "StreamResume",
    "is_cut",
    "is_other_model",
    "looks_cut",
    "pauses",
    "refusal_of_resend",
    "text_digest",
    "wait_until_ready",
]
