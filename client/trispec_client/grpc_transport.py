"""gRPC transport: one bidirectional Triton stream per request, responses handed over through a queue.

A model error arrives as a bare message with no status code: the ``triton_grpc_error`` header would
carry the code, but tritonserver 2.51 segfaulted on that path under load ("HandleCancellation called even
when the context was not cancelled", then signal 11), so it is not used; bad input is recognised by the
model's ``field: ...`` message convention instead, and a refusal for now by its "retry later" (then
retryable, ``SpecDecOverloadedError``). Triton marks an error response final on the wire
(``triton_final_response``), but tritonclient's stream callback hands over only its message, so any
error ends the request.
"""

from __future__ import annotations

import functools
import queue
import time
from collections.abc import Generator
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from trispec_client.errors import (
    DEADLINE_EXCEEDED,
    SpecDecError,
    SpecDecTimeoutError,
    make_error,
    status_from_message,
)
from trispec_client.request import GenerationRequest
from trispec_client.results import StreamChunk, chunk_from_outputs

_FINAL_PARAMETER = "triton_final_response"


def infer_inputs(request: GenerationRequest) -> list[grpcclient.InferInput]:
    inputs = []
    for tensor in request.tensors():
        infer_input = grpcclient.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)
        infer_input.set_data_from_numpy(tensor.array)
        inputs.append(infer_input)
    return inputs


def response_outputs(result: grpcclient.InferResult) -> tuple[dict[str, np.ndarray], bool]:
    """The output tensors of one streamed response, and whether it is the request's final response."""
    response = result.get_response()
    outputs = {output.name: result.as_numpy(output.name) for output in response.outputs}
    final = _FINAL_PARAMETER in response.parameters and response.parameters[_FINAL_PARAMETER].bool_param
    return outputs, bool(final)


def convert_error(exc: InferenceServerException, timeout_s: float) -> SpecDecError:
    """tritonclient's exception → a typed error; its status reads ``StatusCode.X`` or is None."""
    message = exc.message() or str(exc)
    status = exc.status()
    if status is None:
        status = status_from_message(message)
    status = status.removeprefix("StatusCode.")
    if status == DEADLINE_EXCEEDED:
        return SpecDecTimeoutError(f"no final response within {timeout_s:g} s (gRPC: {message})")
    return make_error(message, status)


def stream_grpc(
    url: str, model: str, request: GenerationRequest, timeout_s: float
) -> Generator[StreamChunk, None, None]:
    """Yield the request's chunks until the final one. Closing the generator early cancels the request
    on the server (``stop_stream(cancel_requests=True)``); so does a timeout."""
    deadline = time.monotonic() + timeout_s
    responses: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as exc:
        raise convert_error(exc, timeout_s) from None
    finished = False  # the server is done with the request: final response or error received
    try:
        # stream_timeout is the gRPC deadline: the server sees it too and drops the request when it passes
        client.start_stream(callback=functools.partial(_enqueue, responses), stream_timeout=timeout_s)
        try:
            client.async_stream_infer(model, infer_inputs(request), enable_empty_final_response=True)
        except InferenceServerException as exc:
            # a stream that failed at once (server unreachable) refuses requests with a generic message;
            # the real reason is already on its way to the callback
            finished = True
            raise _queued_error(responses, timeout_s) or convert_error(exc, timeout_s) from None
        token_count = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise queue.Empty
                result, error = responses.get(timeout=remaining)
            except queue.Empty:
                raise SpecDecTimeoutError(f"no final response within {timeout_s:g} s") from None
            if error is not None:
                finished = True
                raise convert_error(error, timeout_s)
            outputs, final = response_outputs(result)
            chunk = chunk_from_outputs(outputs, final=final, previous_token_count=token_count)
            token_count = chunk.token_count
            finished = final
            yield chunk
            if final:
                return
    finally:
        _close(client, cancel=not finished)


def _close(client: grpcclient.InferenceServerClient, *, cancel: bool) -> None:
    """End the stream: gracefully once the server is done (half-close; it ends the call at once, and the
    gRPC deadline bounds the wait), else by cancelling, which cancels the request on the server."""
    stream = getattr(client, "_stream", None)
    try:
        client.stop_stream(cancel_requests=cancel)
    finally:
        # tritonclient 2.51 leaves gRPC's request-sending thread blocked on its queue after a cancel (one
        # leaked thread per cancelled request); the end-of-requests marker lets it finish
        request_queue = getattr(stream, "_request_queue", None)
        if request_queue is not None:
            request_queue.put(None)
        client.close()


def _queued_error(
    responses: queue.Queue[tuple[Any, InferenceServerException | None]], timeout_s: float
) -> SpecDecError | None:
    try:
        _, error = responses.get(timeout=min(1.0, timeout_s))
    except queue.Empty:
        return None
    return None if error is None else convert_error(error, timeout_s)


def _enqueue(
    responses: queue.Queue[tuple[Any, InferenceServerException | None]],
    result: Any,
    error: InferenceServerException | None,
) -> None:
    responses.put((result, error))


def model_ready(url: str, model: str, timeout_s: float) -> bool:
    """Whether Triton says the model is ready (gRPC ``ModelReady``; a resuming client waits for it);
    anything else, an unreachable server included, is not ready."""
    try:
        client = grpcclient.InferenceServerClient(url)
    except Exception:
        return False
    try:
        return bool(client.is_model_ready(model, client_timeout=timeout_s))
    except Exception:
        return False
    finally:
        client.close()
