"""Typed client errors: every failure says which kind it is and carries the server's status."""

from __future__ import annotations

import re

# Canonical status names (gRPC spelling) used for both protocols, so callers need not care which
# one carried the request.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
UNAVAILABLE = "UNAVAILABLE"
UNKNOWN = "UNKNOWN"
ABORTED = "ABORTED"

_HTTP_TO_STATUS = {
    400: INVALID_ARGUMENT,
    404: "NOT_FOUND",
    408: DEADLINE_EXCEEDED,
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: UNAVAILABLE,
    504: DEADLINE_EXCEEDED,
}

# The specdec model starts every bad-input message with the input's name ("top_p: must be in (0, 1]").
# Errors that reach the client without a status code (inside an SSE stream) are classified by it.
INPUT_NAMES = (
    "text_input",
    "max_tokens",
    "num_draft_tokens",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "random_seed",
    "end_id",
    "stop_words",
    "bad_words",
    "stream",
    "exclude_input_in_output",
    "skip_output_tokens",
    "expected_model_fingerprint",
)
_FIELD_PREFIX = re.compile(rf"^\s*({'|'.join(INPUT_NAMES)}):")

# The specdec model's refusals worth retrying: a full queue (scheduler.max_waiting) or a request that
# waited too long for a slot (scheduler.max_queue_delay_s) end with "retry later"; a model on its way
# down says "the model is shutting down" (python_backend/trispec/serving/loop.py). The model sends them
# as UNAVAILABLE, but neither carrier keeps that status: a gRPC stream error has a message only, and
# Triton 2.51's HTTP generate(_stream) answers 400 for every error a model sends
# (docs/serving-errors.md, "Retryable refusals over HTTP"), so they are recognised by these words.
_RETRY_LATER = re.compile(r"retry later\s*$|^\s*the model is shutting down\s*$")


class SpecDecError(Exception):
    """A request failed. ``status`` is a gRPC-style code name (``INVALID_ARGUMENT``, ``INTERNAL``, ...)
    or None when the server gave none; ``http_status`` is set when the HTTP protocol carried it."""

    def __init__(self, message: str, status: str | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.http_status = http_status

    def __str__(self) -> str:
        return f"[{self.status}] {self.message}" if self.status else self.message

    @property
    def retryable(self) -> bool:
        """Worth sending again, after a pause: the server was unreachable or refused it for now."""
        return self.status == UNAVAILABLE


class InvalidRequestError(SpecDecError, ValueError):
    """The request was rejected as invalid, by this client before sending or by the server."""

    def __init__(self, message: str, http_status: int | None = None) -> None:
        super().__init__(message, INVALID_ARGUMENT, http_status)


class SpecDecTimeoutError(SpecDecError, TimeoutError):
    """The client-side deadline passed before the final response arrived."""

    def __init__(self, message: str, http_status: int | None = None) -> None:
        super().__init__(message, DEADLINE_EXCEEDED, http_status)


class SpecDecConnectionError(SpecDecError, ConnectionError):
    """The server could not be reached, or the connection broke mid-request."""

    def __init__(self, message: str, http_status: int | None = None) -> None:
        super().__init__(message, UNAVAILABLE, http_status)


class SpecDecResumeError(SpecDecError):
    """A stream the server cut could not be resumed exactly: the re-sent stream differs from what was
    delivered (a spliced text is never delivered), the server refused to resume it, or it was cut
    too often. The text delivered before the cut is all there is."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ABORTED)


class SpecDecOverloadedError(SpecDecConnectionError):
    """The server refused the request for now (its queue is full, the request waited too long for a
    slot, or the model is shutting down): retry later, here or on another replica."""


def status_from_http(code: int) -> str:
    return _HTTP_TO_STATUS.get(code, f"HTTP_{code}")


def is_retryable_refusal(message: str) -> bool:
    """Whether a model error's message is one of the specdec model's retry-later refusals."""
    return bool(_RETRY_LATER.search(message))


def status_from_message(message: str) -> str:
    """Status for an error that arrived without a code: bad input if it names an input field,
    UNAVAILABLE for the model's retry-later refusals."""
    if _FIELD_PREFIX.match(message):
        return INVALID_ARGUMENT
    return UNAVAILABLE if is_retryable_refusal(message) else UNKNOWN


def make_error(message: str, status: str | None, http_status: int | None = None) -> SpecDecError:
    """The most specific error class for a status."""
    if status == INVALID_ARGUMENT:
        return InvalidRequestError(message, http_status)
    if status == DEADLINE_EXCEEDED:
        return SpecDecTimeoutError(message, http_status)
    if status == UNAVAILABLE:
        if is_retryable_refusal(message):
            return SpecDecOverloadedError(message, http_status)
        return SpecDecConnectionError(message, http_status)
    return SpecDecError(message, status, http_status)
