"""The OpenAI-compatible routes (FastAPI): ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
vLLM's ``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` (trispec_openai.tokenizer_routes),
``/health`` (200 while some Triton replica says the model is ready, else 503: for load balancers; the
body lists each replica, its readiness and the model fingerprint it last named), ``/metrics``
(Prometheus text: ``specdec_resumed_streams_total``, the generations resumed after Triton cut them)
and, behind the admin key, ``POST /reset_prefix_cache`` (trispec_openai.admin).

Bodies are read and validated here rather than by FastAPI's body parameters, so that every failure,
malformed JSON included, is answered in OpenAI's error shape with 400 (FastAPI's own would be 422).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from trispec_openai.admin import add_admin_routes
from trispec_openai.errors import OpenAIError, invalid
from trispec_openai.formats import ChatFormat, CompletionFormat
from trispec_openai.mapping import jobs
from trispec_openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from trispec_openai.service import Call
from trispec_openai.structured import structure_of
from trispec_openai.tokenizer_routes import detokenize, tokenize, tokenizer_info
from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import TritonGenerator

logger = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)


def _validation_error(exc: ValidationError) -> OpenAIError:
    error = exc.errors()[0]
    param = ".".join(str(part) for part in error["loc"]) or None
    message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
    return invalid(f"{param}: {message}" if param else message, param)


async def _parse(request: Request, model: type[Body]) -> Body:
    try:
        data = json.loads(await request.body())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None


def _error_response(error: OpenAIError) -> JSONResponse:
    # overload is retryable: the model refused within its queue delay, so a second later may succeed
    headers = {"Retry-After": "1"} if error.status in (429, 503) else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def metrics_text(generator: TritonGenerator) -> str:
    """The endpoint's own metrics, in Prometheus' text format."""
    name = "specdec_resumed_streams_total"
    return (
        f"# HELP {name} Generations Triton cut (stub or server died) that this endpoint resumed\n"
        f"# TYPE {name} counter\n"
        f'{name}{{model="{generator.model}"}} {generator.resumed_total}\n'
    )


def create_app(generator: TritonGenerator, tokenizer: ServedTokenizer, served_model: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await generator.open()
        try:
            yield
        finally:
            await generator.close()

    app = FastAPI(title="specdec OpenAI-compatible API", lifespan=lifespan)
    started = int(time.time())

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, exc: OpenAIError) -> Response:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def request_error(_: Request, exc: RequestValidationError) -> Response:
        return _error_response(invalid(str(exc)))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else None
        return _error_response(OpenAIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> Response:
        logger.exception("request failed")
        return _error_response(OpenAIError(500, f"internal error: {exc}", code="internal_error"))

    def model_card() -> dict[str, Any]:
        return {"id": served_model, "object": "model", "created": started, "owned_by": "specdec"}

    def check_model(name: str) -> None:
        if name != served_model:
            raise OpenAIError(
                404,
                f"The model '{name}' does not exist; this server serves '{served_model}'",
                param="model",
                code="model_not_found",
            )

    add_admin_routes(app, generator)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name}")
    async def get_model(name: str) -> dict[str, Any]:
        check_model(name)
        return model_card()

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(metrics_text(generator), media_type="text/plain; version=0.0.4")

    def check_named_model(name: str | None) -> None:
        if name is not None:  # optional on vLLM's tokenizer routes
            check_model(name)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> dict[str, Any]:
        body = await _parse(request, TokenizeRequest)
        check_named_model(body.model)
        return tokenize(body, tokenizer)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> dict[str, Any]:
        body = await _parse(request, DetokenizeRequest)
        check_named_model(body.model)
        return detokenize(body, tokenizer)

    @app.get("/tokenizer_info")
    async def tokenizer_info_route() -> dict[str, Any]:
        return tokenizer_info(tokenizer)

    @app.get("/health")
    async def health() -> Response:
        backends = await generator.health()
        ready = any(backend["ready"] for backend in backends)
        return JSONResponse({"ready": ready, "backends": backends}, status_code=200 if ready else 503)

    async def answer(call: Call, stream: bool, request: Request) -> Response:
        return await (call.streamed() if stream else call.whole(request.is_disconnected))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        check_model(body.model)
        prompts = body.prompts
        logprobs = body.logprobs is not None
        fmt = CompletionFormat(served_model, logprobs, body.logprobs or 0)
        call = Call(
            generator,
            tokenizer,
            fmt,
            jobs(body, prompts),
            prompts,
            logprobs=logprobs,
            top_logprobs=body.logprobs or 0,
            include_usage=body.include_usage,
            predicted=body.prediction is not None,
        )
        return await answer(call, body.stream, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        check_model(body.model)
        template = tokenizer.chat_template
        structure = structure_of(body.response_format, body.tools, body.tool_choice, template.source)
        messages = [m.for_template() for m in body.messages]
        prompts = [template.render(messages, structure.template_tools, body.chat_template_kwargs)]
        fmt = ChatFormat(served_model, body.logprobs, structure.tools, body.top_logprobs or 0)
        call = Call(
            generator,
            tokenizer,
            fmt,
            jobs(body, prompts, structure),
            prompts,
            logprobs=body.logprobs,
            top_logprobs=body.top_logprobs or 0,
            include_usage=body.include_usage,
            predicted=body.prediction is not None,
        )
        return await answer(call, body.stream, request)

    return app
