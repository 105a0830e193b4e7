"""One generation as a Triton gRPC stream (async tritonclient), read as typed pieces.

Every request is sent with ``stream=true``, also for non-streaming OpenAI calls: each response then
carries the text verified in one round (and its tokens' log-probs), which both kinds of answer are
built from. The request side of the gRPC stream stays open until the final response arrives; closing
the reader early (the HTTP client went away, a sibling choice failed) cancels the call, which cancels
the request in the model.

A stream the server cut (its stub or tritonserver died and the supervisor restarted it) is resumed
as ``trispec_client`` resumes one (``trispec_client.resume``): wait until the model is ready again
(at most ``resume_timeout_s`` per resume, growing pauses), send the request again with its seed and
``skip_output_tokens``, check that what the server skipped is what was already produced, carry on.
The OpenAI client sees one uninterrupted answer; each resume counts in ``resumed_total``.

Several Triton replicas (``urls``): a new generation goes to the replica its leading text and cache
salt hash to (``trispec_client.routing``: a conversation's turns meet their KV in that replica's
prefix cache), or to the next in turn with ``routing="round-robin"``; one that cannot reach its
replica (connection refused, overloaded) tries the others at once in its order, and a cut stream resumes on a
ready replica serving the same model (``model_fingerprint``), the others first in the request's order
(``trispec_client.routing.resume_order``: the next-highest rendezvous weight keeps its affinity); one
serving another model refuses it, and with none left the answer is an error, never a spliced text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc.aio as aiogrpc
from trispec_client.errors import SpecDecError, SpecDecResumeError
from trispec_client.grpc_transport import infer_inputs, response_outputs
from trispec_client.replicas import split_urls
from trispec_client.request import GenerationRequest
from trispec_client.results import SpeculationStats, chunk_from_outputs
from trispec_client.resume import DEFAULT_RESUME_TIMEOUT_S, StreamResume, looks_cut, pauses
from trispec_client.routing import DEFAULT_PREFIX_CHARS, DEFAULT_ROUTING, Router, Routing, resume_order
from tritonclient.grpc import KeepAliveOptions
from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE
from tritonclient.utils import InferenceServerException

from trispec_openai.errors import OpenAIError, from_model_message, from_rpc_error

logger = logging.getLogger(__name__)

# the model's final response may be flags only; asking for it makes the end of a request explicit
_PARAMETERS = {"triton_enable_empty_final_response": True}
# the input naming this endpoint's tokenizer (``Tokenizer.sha256``): a model of another refuses it
TOKENIZER_INPUT = "expected_tokenizer_sha256"


@dataclass(frozen=True)
class Piece:
    """One response: the text it adds, the log-probs of the tokens it adds (when asked for) and, on the
    final one, why generation ended and the request's speculation totals."""

    text: str
    token_count: int  # cumulative
    logprobs: tuple[float, ...] = ()
    # beside each log-prob when alternatives were asked for: (token id, log-prob), most likely first
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    # when the prompt was scored (the first response): prompt tokens 1.. and their alternatives
    prompt_logprobs: tuple[float, ...] | None = None
    prompt_top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    final: bool = False
    finish_reason: str | None = None
    stats: SpeculationStats | None = None
    # the prompt's length in tokens, from servers that send num_input_tokens
    prompt_tokens: int | None = None
    # the seed a sampled request draws with (on its first response; the server's choice if it had none)
    seed: int | None = None
    # a resumed request's first response: the SHA-256 of the text of the tokens it skipped
    skipped_text_sha256: str | None = None
    # first response: what produces the text (trispec.serving.fingerprint)
    model_fingerprint: str | None = None
    # final response: prompt tokens the server's prefix cache held
    cached_tokens: int | None = None


class _Cut(Exception):
    """The server cut the stream (or is restarting); ``error`` is what to answer if it is not resumed."""

    def __init__(self, error: OpenAIError, started: bool = True) -> None:
        super().__init__(error.message)
        self.error = error
        # the request reached a server: a cut before that (nothing listening) is not resumed
        self.started = started


def _as_error(error: OpenAIError) -> SpecDecError:
    return SpecDecError(error.message)


@dataclass(frozen=True)
class Asked:
    """What a request asks the model to report beside its text."""

    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: bool = False


def _floats(value: np.ndarray | None) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(v) for v in value.reshape(-1))


def _ints(value: np.ndarray | None) -> int | None:
    return None if value is None or value.size == 0 else int(value.reshape(-1)[0])


def _alternatives(
    ids: np.ndarray | None, values: np.ndarray | None
) -> tuple[tuple[tuple[int, float], ...], ...]:
    """``output_top_token_ids`` / ``output_top_log_probs`` ``[1, 1, tokens, N]`` -> per token its
    (id, log-prob) pairs, the padding (id -1) left out."""
    if ids is None or values is None:
        return ()
    count = ids.shape[-1]
    rows = zip(ids.reshape(-1, count).tolist(), values.reshape(-1, count).tolist())
    return tuple(tuple((i, v) for i, v in zip(row_ids, row_values) if i >= 0) for row_ids, row_values in rows)


def int_input(name: str, value: int) -> aiogrpc.InferInput:
    """A [1, 1] INT32 input."""
    tensor = aiogrpc.InferInput(name, [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def scalar_input(name: str, value: bool | float | str) -> aiogrpc.InferInput:
    """A [1, 1] BOOL, FP32 or BYTES input (the model's max_batch_size leads every shape)."""
    if isinstance(value, str):
        array, datatype = np.array([[value.encode("utf-8")]], dtype=object), "BYTES"
    elif isinstance(value, bool):
        array, datatype = np.array([[value]], dtype=np.bool_), "BOOL"
    else:
        array, datatype = np.array([[value]], dtype=np.float32), "FP32"
    tensor = aiogrpc.InferInput(name, [1, 1], datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def channel_args() -> list[tuple[str, object]]:
    """tritonclient's own channel options, with reconnection tried at least every 2 s: gRPC's default
    back-off grows to 120 s, so a replica that restarted (or came up after this endpoint) would be
    seen as down long after it is ready, and never get traffic or resumed streams back."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


def _other_tokenizer(message: str) -> bool:
    """The model refused the request: this endpoint's tokenizer is not the model's."""
    return message.lstrip().startswith(f"{TOKENIZER_INPUT}:")


def _other_model(error: OpenAIError) -> bool:
    """The replica refused a resumed request: it serves another model (another fingerprint)."""
    return error.status == 400 and error.message.lstrip().startswith("expected_model_fingerprint:")


class TritonGenerator:
    """Generations over one gRPC channel per Triton replica, shared by every HTTP request."""

    def __init__(
        self,
        url: str | Sequence[str],
        model: str,
        timeout_s: float,
        resume: bool = True,
        resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S,
        routing: Routing = DEFAULT_ROUTING,
        route_prefix_chars: int = DEFAULT_PREFIX_CHARS,
        tokenizer_sha256: str | None = None,
    ) -> None:
        self.urls = split_urls(url, "localhost:8001")
        # the tokenizer prompts are rendered and tokens counted with here, sent with every request to a
        # model that checks it: a server running another model refuses instead of answering prompts
        # formatted for this one
        self.tokenizer_sha256 = tokenizer_sha256
        self.router = Router(self.urls, routing, route_prefix_chars)
        self.url = self.urls[0]
        self.model = model
        self.timeout_s = timeout_s
        self.resume = resume
        self.resume_timeout_s = resume_timeout_s
        # streams cut by the server and resumed (the endpoint's specdec_resumed_streams_total)
        self.resumed_total = 0
        # Triton answered before: a refused connection now means it is restarting (wait for it)
        self._reached = False
        self._clients: list[aiogrpc.InferenceServerClient] = []
        self._inputs: frozenset[str] | None = None
        # the model fingerprint each replica's last first response named (None: none seen yet)
        self.fingerprints: list[str | None] = [None] * len(self.urls)

    async def open(self) -> None:
        self._clients = [aiogrpc.InferenceServerClient(url, channel_args=channel_args()) for url in self.urls]

    async def close(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()

    @property
    def client(self) -> aiogrpc.InferenceServerClient:
        """The first replica's client."""
        return self.replica(0)

    def replica(self, index: int) -> aiogrpc.InferenceServerClient:
        if not self._clients:
            raise RuntimeError("TritonGenerator.open() was not called")
        return self._clients[index]

    async def replica_ready(self, index: int, timeout_s: float = 5.0) -> bool:
        try:
            return bool(await self.replica(index).is_model_ready(self.model, client_timeout=timeout_s))
        except Exception:
            return False

    async def ready(self) -> bool:
        """Whether some replica's model is ready."""
        return any([await self.replica_ready(i) for i in range(len(self.urls))])

    async def health(self) -> list[dict[str, object]]:
        """Each replica: its address, whether its model is ready, the model fingerprint it named last."""
        return [
            {"url": url, "ready": await self.replica_ready(i), "model_fingerprint": self.fingerprints[i]}
            for i, url in enumerate(self.urls)
        ]

    async def model_inputs(self) -> frozenset[str]:
        """The model's input names (asked once): optional flags are sent only to a model that declares
        them, since Triton refuses an undeclared input."""
        if self._inputs is None:
            error = "no replica"
            for index in range(len(self.urls)):  # any replica that answers: they serve one model
                try:
                    metadata = await self.replica(index).get_model_metadata(self.model, as_json=True)
                except InferenceServerException as exc:
                    error = exc.message()
                    continue
                self._inputs = frozenset(tensor["name"] for tensor in metadata.get("inputs", ()))
                return self._inputs
            raise OpenAIError(503, f"Triton: {error}", code="unavailable")
        return self._inputs

    async def stream(
        self,
        request: GenerationRequest,
        *,
        logprobs: bool,
        request_id: str,
        extra: Sequence[tuple[str, float]] = (),
        top_logprobs: int = 0,
        prompt_logprobs: bool = False,
    ) -> AsyncIterator[Piece]:
        """The request's pieces up to the final one, resumed after every cut when ``resume`` is on;
        raises ``OpenAIError`` on any failure. ``extra``: FP32 inputs beside the request's own
        (penalties); ``top_logprobs``: alternatives beside each log-prob (with ``logprobs``);
        ``prompt_logprobs``: the prompt's too, on the first piece (completions' echo)."""
        state = StreamResume(request)
        resuming_since: float | None = None
        waits = pauses()
        order = self.router.order(request.routing_key, request.cache_salt)
        on = order[0]  # the replica the current attempt goes to
        untried = order[1:]  # replicas a first contact that failed may still try, in order
        other_models: set[int] = set()  # replicas that refused to continue: another model
        while True:
            asked = Asked(logprobs, top_logprobs, prompt_logprobs)
            attempt = self._attempt(state.request(), asked, request_id, extra, on)
            try:
                async for piece in attempt:
                    try:
                        delivered = state.take(piece)
                    except SpecDecResumeError as exc:
                        raise OpenAIError(502, str(exc.message), code="resume_failed") from None
                    if piece.model_fingerprint is not None:
                        self.fingerprints[on] = piece.model_fingerprint
                    resuming_since, self._reached = None, True
                    yield delivered
                    if piece.final:
                        return
                return
            except OpenAIError as exc:
                if state.resumed and _other_model(exc):
                    other_models.add(on)
                    found = await self._ready_replica(resume_order(order, on), other_models)
                    if found is None:
                        message = state.refused(_as_error(exc)).message
                        raise OpenAIError(502, message, code="resume_failed") from None
                    on = found
                    continue
                if state.resumed and exc.status == 400:  # the server cannot resume it exactly
                    message = state.refused(_as_error(exc)).message
                    raise OpenAIError(502, message, code="resume_failed") from None
                if exc.status == 503 and not state.started and untried:  # overloaded: another
                    on, untried = untried[0], untried[1:]
                    continue
                raise
            except _Cut as cut:
                if not cut.started and not state.started and untried:  # unreachable: another
                    on, untried = untried[0], untried[1:]
                    continue
                if not self.resume or not (cut.started or state.started or self._reached):
                    raise cut.error from None
                if resuming_since is None:
                    resuming_since = time.monotonic()
                try:
                    was = state.resumed
                    state.cut(_as_error(cut.error))
                    self.resumed_total += state.resumed - was
                except SpecDecResumeError as exc:
                    raise OpenAIError(502, exc.message, code="resume_failed") from None
                on = await self._wait_ready(
                    resuming_since + self.resume_timeout_s,
                    waits,
                    cut.error,
                    resume_order(order, on),
                    other_models,
                )
            finally:
                await attempt.aclose()  # cancels the Triton request if it is still running

    async def _ready_replica(self, order: list[int], skip: set[int]) -> int | None:
        for index in order:
            if index not in skip and await self.replica_ready(index, 2.0):
                return index
        return None

    async def _wait_ready(
        self, until: float, waits: Iterator[float], cause: OpenAIError, order: list[int], skip: set[int]
    ) -> int:
        """The first replica in ``order`` (not in ``skip``) whose model is ready, probing with growing
        pauses; 503 once ``until`` passed."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                raise OpenAIError(
                    503,
                    f"the stream was cut ({cause.message}) and the model was not ready again within "
                    f"{self.resume_timeout_s:g} s",
                    code="unavailable",
                )
            await asyncio.sleep(min(next(waits), left))
            found = await self._ready_replica(order, skip)
            if found is not None:
                return found

    async def _attempt(
        self,
        request: GenerationRequest,
        asked: Asked,
        request_id: str,
        extra: Sequence[tuple[str, float]],
        replica: int = 0,
    ) -> AsyncIterator[Piece]:
        """One Triton request's pieces from ``replica``; a failure that says the server cut the stream
        raises ``_Cut``."""
        inputs = infer_inputs(request) + [scalar_input(name, value) for name, value in extra]
        declared = await self.model_inputs()
        if request.prediction and "prediction" not in declared:
            raise OpenAIError(501, "prediction: this server's model takes none", param="prediction")
        if request.logit_bias and "logit_bias_ids" not in declared:
            raise OpenAIError(501, "logit_bias: this server's model does not apply it", param="logit_bias")
        if request.cache_salt is not None and "cache_salt" not in declared:
            raise OpenAIError(
                501,
                "cache_salt: this server's model does not isolate its KV cache by salt",
                param="cache_salt",
            )
        logprobs = asked.logprobs
        if asked.prompt_logprobs:
            if "return_prompt_log_probs" not in declared:
                raise OpenAIError(501, "echo: this server's model does not score prompts", param="echo")
            inputs.append(scalar_input("return_prompt_log_probs", True))
        if logprobs:
            if "return_log_probs" not in declared:
                raise OpenAIError(
                    501, "logprobs: this server's model does not return log-probs", param="logprobs"
                )
            inputs.append(scalar_input("return_log_probs", True))
        if asked.top_logprobs:
            if "top_log_probs" not in declared:
                raise OpenAIError(
                    501,
                    "top_logprobs: this server's model does not return alternatives to each token",
                    param="top_logprobs",
                )
            inputs.append(int_input("top_log_probs", asked.top_logprobs))
        if "return_num_input_tokens" in declared:
            inputs.append(scalar_input("return_num_input_tokens", True))
        if self.tokenizer_sha256 and TOKENIZER_INPUT in declared:
            inputs.append(scalar_input(TOKENIZER_INPUT, self.tokenizer_sha256))
        done = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, object]]:
            yield {
                "model_name": self.model,
                "inputs": inputs,
                "request_id": request_id,
                "parameters": _PARAMETERS,
            }
            # half-closing before the last response would let the call end early
            await done.wait()

        call = self.replica(replica).stream_infer(requests(), stream_timeout=self.timeout_s)
        finished = False
        token_count = 0
        started = False
        try:
            async for result, error in call:
                if error is not None:
                    finished = True  # an error ends the request in the model; nothing to cancel
                    message = error.message() or str(error)
                    if _other_tokenizer(message):
                        raise _misconfigured(message)
                    answer = from_model_message(message, declared)
                    if looks_cut(message):
                        raise _Cut(answer)
                    raise answer
                outputs, final = response_outputs(result)
                chunk = chunk_from_outputs(outputs, final=final, previous_token_count=token_count)
                token_before, token_count = token_count, chunk.token_count
                values = outputs.get("output_log_probs")
                if logprobs and values is None and chunk.token_count > token_before:
                    # a model from before log-probs accepts return_log_probs and ignores it
                    raise OpenAIError(
                        501, "logprobs: this server's model does not return log-probs", param="logprobs"
                    )
                finished = final
                started = True
                yield Piece(
                    text=chunk.text,
                    token_count=chunk.token_count,
                    logprobs=() if values is None else tuple(float(v) for v in values.reshape(-1)),
                    top_logprobs=_alternatives(
                        outputs.get("output_top_token_ids"), outputs.get("output_top_log_probs")
                    ),
                    prompt_logprobs=_floats(outputs.get("prompt_log_probs")),
                    prompt_top_logprobs=_alternatives(
                        outputs.get("prompt_top_token_ids"), outputs.get("prompt_top_log_probs")
                    ),
                    final=final,
                    finish_reason=chunk.finish_reason,
                    stats=chunk.stats,
                    prompt_tokens=_ints(outputs.get("num_input_tokens")),
                    seed=chunk.seed,
                    skipped_text_sha256=chunk.skipped_text_sha256,
                    model_fingerprint=chunk.model_fingerprint,
                    cached_tokens=chunk.cached_tokens,
                )
                if final:
                    return
            finished = True
            ended = OpenAIError(502, "Triton ended the stream before the final response", code="bad_gateway")
            raise _Cut(ended, started=started)
        except grpc.aio.AioRpcError as exc:
            finished = True
            answer = from_rpc_error(exc)
            details = exc.details() or ""
            if exc.code() == grpc.StatusCode.UNAVAILABLE or looks_cut(details):
                # UNAVAILABLE before anything arrived may be a server that was never there
                raise _Cut(answer, started=started or looks_cut(details)) from None
            raise answer from None
        finally:
            done.set()
            if not finished:
                call.cancel()


def _misconfigured(message: str) -> OpenAIError:
    """The model runs another tokenizer than this endpoint: every answer would be to a prompt in the
    wrong chat format, so none is given. Not the caller's fault: 500, logged for the operator."""
    logger.error("specdec-openai is misconfigured: the model refused its tokenizer: %s", message)
    return OpenAIError(500, f"specdec-openai is misconfigured: {message}", code="tokenizer_mismatch")
