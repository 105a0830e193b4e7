"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with their HTTP status.

Triton delivers a model's error on a gRPC stream as a bare message without a status code, so its kind
is read from the model's conventions: bad input starts with the tensor's name (``top_p: ...``), an
overloaded server says "retry later" (or that it is shutting down).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import grpc

# tensor (and trispec_client field) names → the OpenAI request field a client sent
_PARAM_OF_TENSOR = {
    "text_input": "prompt",
    "input_ids": "prompt",
    "stop_words": "stop",
    "random_seed": "seed",
    "max_tokens": "max_tokens",
    "num_draft_tokens": "num_draft_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "seed": "seed",
    "return_log_probs": "logprobs",
    "top_log_probs": "top_logprobs",
    "logit_bias_ids": "logit_bias",
    "logit_bias_values": "logit_bias",
    "logit_bias": "logit_bias",
    "cache_salt": "cache_salt",
    "prediction": "prediction",
    "min_tokens": "min_tokens",
    "repetition_penalty": "repetition_penalty",
}
_FIELD_PREFIX = re.compile(r"^\s*([a-z_]+):")
_OVERLOADED = ("retry later", "shutting down")

# gRPC codes of a failed call (not of a model's error) → HTTP status
_HTTP_OF_GRPC = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class OpenAIError(Exception):
    """A request failed; ``body()`` is what the client receives, with ``status`` as the HTTP code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _type_of(status)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _type_of(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


def invalid(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code="invalid_value")


def unsupported(param: str, why: str) -> OpenAIError:
    return OpenAIError(400, f"{param}: {why}", param=param, code="unsupported_value")


def param_of(message: str, inputs: Collection[str] = _PARAM_OF_TENSOR) -> str | None:
    """The field a ``field: ...`` message from the model or trispec_client names, if it is one of
    ``inputs`` (tensor names): the OpenAI name where it has one, else the tensor's."""
    match = _FIELD_PREFIX.match(message)
    if match is None or match.group(1) not in inputs:
        return None
    return _PARAM_OF_TENSOR.get(match.group(1), match.group(1))


def from_model_message(message: str, inputs: Collection[str] = _PARAM_OF_TENSOR) -> OpenAIError:
    """A model error that arrived on the stream without a status code; ``inputs`` are the model's
    input names (bad input is refused with a message starting with one)."""
    param = param_of(message, {*inputs, *_PARAM_OF_TENSOR})
    if param is not None:
        return invalid(message, param)
    if any(marker in message for marker in _OVERLOADED):
        return OpenAIError(503, message, code="overloaded")
    return OpenAIError(500, message, code="internal_error")


def from_rpc_error(error: grpc.aio.AioRpcError) -> OpenAIError:
    """A gRPC call to Triton that failed as a call: unreachable, deadline passed, ..."""
    status = _HTTP_OF_GRPC.get(error.code(), 500)
    details = error.details() or str(error.code())
    return OpenAIError(status, f"Triton: {details}", code=error.code().name.lower())
