"""``SpecDecClient``: stream or generate from the specdec model over gRPC or HTTP, always under a deadline."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Literal

from trispec_client.errors import SpecDecError, SpecDecTimeoutError
from trispec_client.replicas import Replicas, split_urls
from trispec_client.request import GenerationRequest
from trispec_client.results import Completion, StreamChunk, collect
from trispec_client.resume import (
    DEFAULT_RESUME_TIMEOUT_S,
    StreamResume,
    is_cut,
    is_other_model,
    pauses,
    refusal_of_resend,
    wait_until_ready,
)
from trispec_client.routing import DEFAULT_PREFIX_CHARS, DEFAULT_ROUTING, Routing, resume_order

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
    With ``resume`` (the default), a stream the server cut (it crashed or restarted) is resumed
    exactly (``trispec_client.resume``): the client waits for the model to be ready again, at most
    ``resume_timeout_s`` per resume with growing pauses, sends the request again with the same seed
    and ``skip_output_tokens``, checks that what the server skipped is what was delivered (else
    :class:`~trispec_client.errors.SpecDecResumeError`) and carries on; the caller sees one stream,
    whose final chunk says ``stats.resumed``. Time spent resuming extends the deadline.
    Inputs left at ``None`` (or empty) are not sent, so the server's defaults apply.
    Thread-safe: every request opens its own gRPC stream / HTTP connection.

    ``url`` may name several replicas of the model (a list, or one string with commas): a new request
    goes to the replica its leading text (and cache salt) hashes to (``routing="prefix"``, so a
    conversation's turns find their KV in that replica's prefix cache; ``trispec_client.routing``) or
    to the next in turn (``"round-robin"``); one that cannot reach its replica tries the others (then
    pauses, ``retries`` rounds), and a cut stream is resumed on the first ready one of the others in
    the request's order (the next-highest rendezvous weight: it keeps its affinity), then its own.
    A replica that serves another model (another ``model_fingerprint``) never continues a stream; if
    no ready replica serves the model the stream began on, it ends in ``SpecDecResumeError``.
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        protocol: Protocol = "grpc",
        model: str = DEFAULT_MODEL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        resume: bool = True,
        resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
        routing: Routing = DEFAULT_ROUTING,
        route_prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol: Protocol = protocol
        self.model = model
        self.timeout_s = check_timeout(timeout_s)
        self.retries = check_retries(retries)
        self.resume = bool(resume)
        self.resume_timeout_s = check_timeout(resume_timeout_s)
        # a response came from these servers before: a refused connection now means they are
        # restarting, not a wrong address, so a new request waits for them too
        self._reached = False
        self.replicas = Replicas(
            split_urls(url, DEFAULT_URLS[protocol]), protocol, model, routing, route_prefix_chars
        )
        self.urls = self.replicas.urls
        self.url = self.urls[0]

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
        cache_salt: str | None = None,
        logit_bias: Mapping[int, float] | None = None,
        prediction: str | None = None,
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
            cache_salt=cache_salt,
            logit_bias=logit_bias,
            prediction=prediction,
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
        cache_salt: str | None = None,
        logit_bias: Mapping[int, float] | None = None,
        prediction: str | None = None,
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
            cache_salt=cache_salt,
            logit_bias=logit_bias,
            prediction=prediction,
        )
        return collect(self._send(request, self._timeout(timeout_s)))

    def close(self) -> None:
        self.replicas.close()

    def __enter__(self) -> SpecDecClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else check_timeout(timeout_s)

    def _send(self, request: GenerationRequest, timeout_s: float) -> Generator[StreamChunk, None, None]:
        order = self.replicas.order(request)
        if self.resume:
            return self._resuming(request, timeout_s, order)
        return _with_retries(
            lambda left_s, replica: self._attempt(request, left_s, replica), timeout_s, self.retries, order
        )

    def _attempt(
        self, request: GenerationRequest, timeout_s: float, replica: int = 0
    ) -> Generator[StreamChunk, None, None]:
        return self.replicas.attempt(replica, request, timeout_s)

    def _resuming(
        self, request: GenerationRequest, timeout_s: float, order: Sequence[int] = (0,)
    ) -> Generator[StreamChunk, None, None]:
        """The request's chunks as one stream, resumed after every cut (see the class docstring)."""
        state = StreamResume(request)
        deadline = time.monotonic() + timeout_s
        resuming_since: float | None = None  # when the stream being resumed was cut
        credited = 0.0  # when the deadline was last moved for the time spent resuming
        waits = pauses()
        on = [order[0]]  # the replica the current attempt went to
        other_models: set[int] = set()  # replicas that refused to continue: they serve another model
        while True:
            now = time.monotonic()
            if resuming_since is not None:  # time spent waiting for the server does not count
                deadline, credited = deadline + now - credited, now
            left = deadline - now
            if left <= 0:
                raise SpecDecTimeoutError(f"no final response within {timeout_s:g} s")
            if state.resumed == 0:  # the first send: refusals for now are retried as ever
                chunks = _with_retries(
                    lambda s, replica: self._attempt(request, s, replica),
                    timeout_s,
                    self.retries,
                    order,
                    landed=on,
                )
            else:  # the server first generates again what it skips: that may take a resume's time
                chunks = self._attempt(state.request(), left + self.resume_timeout_s, on[0])
            try:
                for chunk in chunks:
                    delivered = state.take(chunk)
                    self._reached = True
                    if resuming_since is not None:
                        deadline += time.monotonic() - credited
                        resuming_since, waits = None, pauses()
                    yield delivered
                    if chunk.final:
                        return
                return
            except SpecDecError as exc:
                if state.resumed and is_other_model(exc):
                    # this replica serves another model: only a ready one serving ours may go on
                    other_models.add(on[0])
                    found = self._ready_replica(resume_order(order, on[0]), other_models, 2.0)
                    if found is None:
                        raise state.refused(exc) from exc
                    on[0] = found
                    continue
                if state.resumed and refusal_of_resend(exc):
                    raise state.refused(exc) from exc
                if not is_cut(exc, started=state.started, reached=self._reached):
                    raise
                if resuming_since is None:
                    resuming_since = credited = time.monotonic()
                state.cut(exc)
                # the request's own order (by rendezvous weight): it keeps its prefix affinity
                looking = resume_order(order, on[0])

                def ready(probe_s: float, looking: list[int] = looking) -> bool:
                    found = self._ready_replica(looking, other_models, probe_s)
                    if found is not None:
                        on[0] = found
                    return found is not None

                wait_until_ready(ready, resuming_since, self.resume_timeout_s, waits, exc)
            finally:
                chunks.close()  # leaving early cancels the request on the server

    def _ready_replica(self, order: list[int], skip: set[int], probe_s: float) -> int | None:
        """The first replica in ``order`` (not in ``skip``) whose model is ready, or None."""
        for index in order:
            if index not in skip and self.replicas.model_ready(index, probe_s):
                return index
        return None

    def _model_ready(self, timeout_s: float) -> bool:
        """Whether some replica's model is ready."""
        return self._ready_replica(list(range(len(self.replicas))), set(), timeout_s) is not None


def _with_retries(
    attempt: Callable[[float, int], Generator[StreamChunk, None, None]],
    timeout_s: float,
    retries: int,
    order: Sequence[int] = (0,),
    landed: list[int] | None = None,
) -> Generator[StreamChunk, None, None]:
    """The chunks of the first attempt that gets as far as a chunk. ``attempt(seconds left, replica)``
    that fails retryably before that (unreachable, refused for now) is made on the next replica of
    ``order`` at once; once every replica failed, after a pause, for ``retries`` more rounds, within
    ``timeout_s``. ``landed[0]`` is set to the replica that answered."""
    deadline = time.monotonic() + timeout_s
    tries = 0
    replicas = len(order)
    while True:
        replica = order[tries % replicas]
        chunks = attempt(timeout_s if tries == 0 else max(deadline - time.monotonic(), 1e-3), replica)
        try:
            first = next(chunks)
        except StopIteration:
            return
        except SpecDecError as exc:
            if not exc.retryable or tries + 1 >= (retries + 1) * replicas:
                raise
            tries += 1
            if tries % replicas == 0:  # every replica failed this round: pause before the next
                pause = RETRY_DELAY_S * 2 ** (tries // replicas - 1) * random.uniform(0.5, 1.0)
                if time.monotonic() + pause >= deadline:
                    raise
                time.sleep(pause)
            continue
        if landed is not None:
            landed[0] = replica
        try:
            yield first
            yield from chunks
        finally:
            chunks.close()  # leaving early cancels the request on the server
        return
