"""``SpecDecClient``: stream or generate from the specdec model over gRPC or HTTP, always under a deadline."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Generator, Iterable
from types import TracebackType
from typing import Literal

from trispec_client.errors import SpecDecError
from trispec_client.request import GenerationRequest
from trispec_client.results import Completion, StreamChunk, collect

Protocol = Literal["grpc", "http"]
PROTOCOLS: tuple[Protocol, ...] = ("grpc", "http")
DEFAULT_URLS: dict[str, str] = {"grpc": "localhost:8001", "http": "localhost:8000"}
DEFAULT_MODEL = "specdec"
DEFAULT_TIMEOUT_S = 60.0
# a request refused for now (full queue, shutting down) or that found no server is sent again this
# many times, after 0.25 s, 0.5 s, 1 s ... (each between half and all of that), within its deadline
DEFAULT_RETRIES = 3
RETRY_DELAY_S = 0.25


def check_retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries: must be an integer >= 0, got {retries!r}")
    return retries


def check_timeout(timeout_s: float) -> float:
    """A finite, positive number of seconds: there is no way to wait forever."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
        raise ValueError(f"timeout_s: must be a number of seconds, got {timeout_s!r}")
    if not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s: must be finite and > 0, got {timeout_s!r}")
    return float(timeout_s)


class SpecDecClient:
    """Client for the decoupled ``specdec`` model.

    ``timeout_s`` bounds each whole request (first byte to final response, retries included); a
    request that overruns raises :class:`~trispec_client.errors.SpecDecTimeoutError` and is cancelled
    on the server. A request that fails retryably before its first chunk (``error.retryable``: the
    server refused it for now, :class:`~trispec_client.errors.SpecDecOverloadedError`, or could not be
    reached) is sent again up to ``retries`` times, with growing pauses, while the deadline allows;
    the last error is raised. Nothing is retried once text has arrived.
    Inputs left at ``None`` (or empty) are not sent, so the server's defaults apply.
    Thread-safe: every request opens its own gRPC stream / HTTP connection.
    """

    def __init__(
        self,
        url: str | None = None,
        protocol: Protocol = "grpc",
        model: str = DEFAULT_MODEL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol: Protocol = protocol
        self.model = model
        self.timeout_s = check_timeout(timeout_s)
        self.retries = check_retries(retries)
        self.url = url or DEFAULT_URLS[protocol]
        if protocol == "http":
            from trispec_client.http_transport import make_pool

            self._pool, self._prefix = make_pool(self.url)
        else:
            self.url = self.url.removeprefix("grpc://")
            if "://" in self.url or "/" in self.url:
                raise ValueError(f"url: gRPC expects host:port, got {url!r}")

    def stream(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        num_draft_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        end_id: int | None = None,
        stop_words: Iterable[str] = (),
        bad_words: Iterable[str] = (),
        timeout_s: float | None = None,
    ) -> Generator[StreamChunk, None, None]:
        """Chunks of newly verified text as the server produces them; the last has ``final=True``.

        Arguments are checked now; the request is sent on the first ``next()``. Leaving the loop early
        (``break``, an exception, ``.close()``) cancels the request on the server.
        """
        request = GenerationRequest(
            prompt,
            max_tokens=max_tokens,
            num_draft_tokens=num_draft_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            end_id=end_id,
            stop_words=tuple(stop_words),
            bad_words=tuple(bad_words),
            stream=True,
        )
        return self._send(request, self._timeout(timeout_s))

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int | None = None,
        num_draft_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        end_id: int | None = None,
        stop_words: Iterable[str] = (),
        bad_words: Iterable[str] = (),
        exclude_input_in_output: bool | None = None,
        timeout_s: float | None = None,
    ) -> Completion:
        """One non-streamed request (``stream=false``): the server answers once with the whole text,
        which starts with the prompt unless ``exclude_input_in_output=True`` (the server's default rule)."""
        request = GenerationRequest(
            prompt,
            max_tokens=max_tokens,
            num_draft_tokens=num_draft_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            end_id=end_id,
            stop_words=tuple(stop_words),
            bad_words=tuple(bad_words),
            stream=False,
            exclude_input_in_output=exclude_input_in_output,
        )
        return collect(self._send(request, self._timeout(timeout_s)))

    def close(self) -> None:
        if self.protocol == "http":
            self._pool.close()

    def __enter__(self) -> SpecDecClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else check_timeout(timeout_s)

    def _send(self, request: GenerationRequest, timeout_s: float) -> Generator[StreamChunk, None, None]:
        return _with_retries(lambda left_s: self._attempt(request, left_s), timeout_s, self.retries)

    def _attempt(self, request: GenerationRequest, timeout_s: float) -> Generator[StreamChunk, None, None]:
        if self.protocol == "http":
            from trispec_client.http_transport import stream_http

            return stream_http(self._pool, self._prefix, self.model, request, timeout_s)
        # imported here: tritonclient.grpc takes a while to import and HTTP users never need it
        from trispec_client.grpc_transport import stream_grpc

        return stream_grpc(self.url, self.model, request, timeout_s)


def _with_retries(
    attempt: Callable[[float], Generator[StreamChunk, None, None]], timeout_s: float, retries: int
) -> Generator[StreamChunk, None, None]:
    """The chunks of the first attempt that gets as far as a chunk; an attempt that fails retryably
    before that is made again (``attempt(seconds left)``) up to ``retries`` times within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    tries = 0
    while True:
        chunks = attempt(timeout_s if tries == 0 else max(deadline - time.monotonic(), 1e-3))
        try:
            first = next(chunks)
        except StopIteration:
            return
        except SpecDecError as exc:
            pause = RETRY_DELAY_S * 2**tries * random.uniform(0.5, 1.0)
            if not exc.retryable or tries >= retries or time.monotonic() + pause >= deadline:
                raise
            tries += 1
            time.sleep(pause)
            continue
        try:
            yield first
            yield from chunks
        finally:
            chunks.close()  # leaving early cancels the request on the server
        return
