"""Typed client errors: every failure says which kind it is and carries the server's status."""

from __future__ import annotations

import re

# Canonical status names (gRPC spelling) used for both protocols, so callers need not care which
# one carried the request.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
UNAVAILABLE = "UNAVAILABLE"
UNKNOWN = "UNKNOWN"

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
)
_FIELD_PREFIX = re.compile(rf"^\s*({'|'.join(INPUT_NAMES)}):")


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


def status_from_http(code: int) -> str:
    return _HTTP_TO_STATUS.get(code, f"HTTP_{code}")


def status_from_message(message: str) -> str:
    """Status for an error that arrived without a code: bad input if it names an input field."""
    return INVALID_ARGUMENT if _FIELD_PREFIX.match(message) else UNKNOWN


def make_error(message: str, status: str | None, http_status: int | None = None) -> SpecDecError:
    """The most specific error class for a status."""
    if status == INVALID_ARGUMENT:
        return InvalidRequestError(message, http_status)
    if status == DEADLINE_EXCEEDED:
        return SpecDecTimeoutError(message, http_status)
    if status == UNAVAILABLE:
        return SpecDecConnectionError(message, http_status)
    return SpecDecError(message, status, http_status)
