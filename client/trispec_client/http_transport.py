"""HTTP transport: Triton's ``generate_stream`` extension (server-sent events) over urllib3.

What Triton 2.51 does, and this module relies on:
- the reply starts with the first model response; an error *as* the first response comes back as
  HTTP 400 with one SSE event ``{"error": ...}``, whatever its real kind: the status is read from the
  model's error after it was freed (docs/serving-errors.md, "Retryable refusals over HTTP"), so such a
  400 is classified by its message (bad input names its field; a full queue says "retry later", which
  makes it retryable like the gRPC UNAVAILABLE it was sent as); errors before the model (unknown
  model, bad JSON) are plain JSON bodies with their own status;
- an error after the first event arrives inside the 200 stream as ``{"error": ...}``;
- the stream ends after the final response; a flags-only final response sends no event;
- closing the connection cancels the request on the server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ReadTimeoutError

from trispec_client.errors import (
    SpecDecConnectionError,
    SpecDecError,
    SpecDecTimeoutError,
    is_retryable_refusal,
    make_error,
    status_from_http,
    status_from_message,
)
from trispec_client.request import GenerationRequest
from trispec_client.results import StreamChunk, chunk_from_outputs
from trispec_client.sse import SSEParser

CONNECT_TIMEOUT_S = 10.0
_READ_SIZE = 64 * 1024
_MAX_ERROR_BODY = 1 << 20
_NOT_OUTPUTS = ("model_name", "model_version", "id")


def make_pool(url: str) -> tuple[urllib3.HTTPConnectionPool, str]:
    """A connection pool for ``host:port`` or ``http(s)://host:port[/prefix]``, and the path prefix."""
    parsed = urllib3.util.parse_url(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"url: expected host:port or http(s)://host:port, got {url!r}")
    pool = urllib3.connection_from_url(
        f"{parsed.scheme}://{parsed.netloc}", maxsize=8, block=False, retries=False
    )
    return pool, (parsed.path or "").rstrip("/")


def error_from_response(http_status: int, content_type: str, body: bytes) -> SpecDecError:
    """Typed error for a non-200 reply: an SSE ``{"error"}`` event, a JSON ``{"error"}`` or plain text."""
    text = body.decode("utf-8", errors="replace")
    message = None
    is_sse = "text/event-stream" in content_type
    payloads = _sse_payloads(body) if is_sse else [text]
    for payload in payloads:
        try:
            decoded = json.loads(payload)
        except ValueError:
            continue
        if isinstance(decoded, dict) and "error" in decoded:
            message = str(decoded["error"])
            break
    if message is None:
        message = text.strip() or f"HTTP {http_status}"
    status = status_from_http(http_status)
    if http_status == 400 and (is_sse or is_retryable_refusal(message)):
        # the model's first response was an error: Triton says 400 whatever the error was
        status = status_from_message(message)
    return make_error(message, status, http_status)


def event_to_chunk(payload: str, previous_token_count: int) -> StreamChunk:
    """One SSE ``data`` payload → a chunk; an ``{"error"}`` event raises. The final response is the one
    carrying ``finish_reason`` (every specdec final response does)."""
    try:
        event = json.loads(payload)
    except ValueError:
        raise SpecDecError(f"server sent an event that is not JSON: {payload[:200]!r}") from None
    if not isinstance(event, dict):
        raise SpecDecError(f"server sent an event that is not a JSON object: {payload[:200]!r}")
    if "error" in event:
        message = str(event["error"])
        raise make_error(message, status_from_message(message), 200)
    outputs = {k: v for k, v in event.items() if k not in _NOT_OUTPUTS}
    final = outputs.get("finish_reason") is not None
    return chunk_from_outputs(outputs, final=final, previous_token_count=previous_token_count)


def stream_http(
    pool: urllib3.HTTPConnectionPool, prefix: str, model: str, request: GenerationRequest, timeout_s: float
) -> Generator[StreamChunk, None, None]:
    """Yield the request's chunks until the final one. Closing the generator early closes the connection,
    which cancels the request on the server; so does a timeout or an error."""
    deadline = time.monotonic() + timeout_s
    body = json.dumps(request.json_body()).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    timeout = urllib3.Timeout(connect=min(CONNECT_TIMEOUT_S, timeout_s), read=timeout_s)
    try:
        response = pool.urlopen(
            "POST",
            f"{prefix}/v2/models/{model}/generate_stream",
            body=body,
            headers=headers,
            timeout=timeout,
            preload_content=False,
            retries=False,
            redirect=False,
        )
    except Exception as exc:
        raise _convert(exc, timeout_s) from None
    try:
        if response.status != 200:
            raise error_from_response(
                response.status,
                response.headers.get("Content-Type", ""),
                _read_error_body(response, deadline),
            )
        parser = SSEParser()
        token_count = 0
        while True:
            data = _read(response, deadline, timeout_s)
            payloads = parser.feed(data) if data else parser.close()
            for payload in payloads:
                chunk = event_to_chunk(payload, token_count)
                token_count = chunk.token_count
                yield chunk
                if chunk.final:
                    return
            if not data:
                # a clean end after a flags-only final response: Triton sent no event for it
                yield StreamChunk(text="", token_count=token_count, final=True)
                return
    finally:
        # never back to the pool: an unread rest would poison the connection, and closing is what
        # tells the server to stop a request that is still running
        response.close()


def _read(response: urllib3.BaseHTTPResponse, deadline: float, timeout_s: float) -> bytes:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SpecDecTimeoutError(f"no final response within {timeout_s:g} s")
    # urllib3's read timeout is per socket read; shrink it so the whole request keeps to the deadline
    connection = response.connection
    if connection is not None and connection.sock is not None:
        connection.sock.settimeout(remaining)
    try:
        return response.read1(_READ_SIZE)
    except Exception as exc:
        raise _convert(exc, timeout_s) from None


def _read_error_body(response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
    body = b""
    try:
        while len(body) < _MAX_ERROR_BODY and time.monotonic() < deadline:
            data = _read(response, deadline, 0.0)
            if not data:
                break
            body += data
    except SpecDecError:
        pass  # the status already says what went wrong; keep what was read
    return body


def _convert(exc: Exception, timeout_s: float) -> SpecDecError:
    if isinstance(exc, SpecDecError):
        return exc
    if isinstance(exc, ReadTimeoutError | TimeoutError) or (
        isinstance(exc, ConnectTimeoutError) and not isinstance(exc, NewConnectionError)
    ):
        return SpecDecTimeoutError(f"no final response within {timeout_s:g} s")
    if isinstance(exc, HTTPError | OSError):
        return SpecDecConnectionError(f"connection failed: {exc}")
    return SpecDecError(f"{type(exc).__name__}: {exc}")


def _sse_payloads(body: bytes) -> list[str]:
    parser = SSEParser()
    return parser.feed(body) + parser.close()


def model_ready(pool: urllib3.HTTPConnectionPool, prefix: str, model: str, timeout_s: float) -> bool:
    """Whether ``/v2/models/<model>/ready`` says 200 (a resuming client waits for it); anything else,
    an unreachable server included, is not ready."""
    try:
        response = pool.urlopen(
            "GET", f"{prefix}/v2/models/{model}/ready", timeout=timeout_s, retries=False, redirect=False
        )
    except Exception:
        return False
    return response.status == 200
