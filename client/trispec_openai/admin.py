"""``POST /reset_prefix_cache`` (vLLM's route; ``/flush_cache``, SGLang's, is the same): empty the
prefix cache of every Triton replica behind this endpoint, behind the admin key.

The endpoint holds no key of its own: it passes the caller's ``specdec-admin-key`` header to each
replica's model, which checks it against its server's (``trispec.serving.admin``); running requests go
on there, untouched. Answers: 200 and each replica's report (per KV pool, the cached blocks emptied and
the blocks running requests still hold) once every replica reset; 403 when a replica refused the key
(missing or wrong), as Triton's own admin APIs answer; 501 when a replica's model cannot reset (the
TensorRT-LLM runner, a model from before resets); 503 when one could not be reached. Replicas that did
reset are named in the error's message: a reset is not undone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse
from trispec.serving.admin import RESET_INPUT
from trispec.serving.triton_command import ADMIN_KEY_HEADER
from trispec_client.grpc_transport import response_outputs

from trispec_openai.errors import OpenAIError, from_rpc_error
from trispec_openai.triton import TritonGenerator, scalar_input

# a reset waits for the replica's step in progress, not for any request to finish
RESET_TIMEOUT_S = 60.0


def _refusal(message: str) -> OpenAIError:
    """A replica model's refusal of the reset, with the status the caller gets."""
    if message.startswith(f"{ADMIN_KEY_HEADER}:"):
        return OpenAIError(403, message, code="permission_denied", kind="permission_error")
    # this model cannot (the TensorRT-LLM runner), or knows no resets (Triton refuses the input)
    if message.startswith(f"{RESET_INPUT}:") or f"input '{RESET_INPUT}'" in message:
        return OpenAIError(501, message, code="not_implemented")
    if "retry later" in message or "shutting down" in message:
        return OpenAIError(503, message, code="unavailable")
    return OpenAIError(500, message, code="internal_error")


async def reset_replica(generator: TritonGenerator, index: int, admin_key: str | None) -> dict[str, Any]:
    """One replica's reset: its model's report, or ``OpenAIError``."""
    done = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, object]]:
        yield {
            "model_name": generator.model,
            "inputs": [scalar_input(RESET_INPUT, True)],
            "request_id": RESET_INPUT,
        }
        await done.wait()  # half-closing before the response would let the call end early

    headers = {ADMIN_KEY_HEADER: admin_key} if admin_key is not None else None
    call = generator.replica(index).stream_infer(requests(), stream_timeout=RESET_TIMEOUT_S, headers=headers)
    try:
        async for result, error in call:  # one response, with the final flag (or the error)
            if error is not None:
                raise _refusal(error.message() or str(error))
            outputs, _ = response_outputs(result)
            return dict(json.loads(outputs["text_output"].reshape(-1)[0]))
        raise OpenAIError(502, "Triton ended the reset without a response", code="bad_gateway")
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        done.set()


async def reset_all(generator: TritonGenerator, admin_key: str | None) -> dict[str, Any]:
    """Reset every replica at once; the first refusal that matters most (the key's, else the first)
    is raised once all have answered, naming the replicas that did reset."""
    urls = generator.urls
    outcomes = await asyncio.gather(
        *(reset_replica(generator, i, admin_key) for i in range(len(urls))), return_exceptions=True
    )
    failed = [(url, o) for url, o in zip(urls, outcomes) if isinstance(o, BaseException)]
    if failed:
        errors = [e if isinstance(e, OpenAIError) else OpenAIError(500, str(e)) for _, e in failed]
        worst = next((e for e in errors if e.status == 403), errors[0])
        done = [url for url, o in zip(urls, outcomes) if not isinstance(o, BaseException)]
        said = "; ".join(f"{url}: {e.message}" for (url, _), e in zip(failed, errors))
        reset = f" (reset: {', '.join(done)})" if done else ""
        raise OpenAIError(worst.status, f"{said}{reset}", code=worst.code, kind=worst.kind)
    return {
        "object": "prefix_cache_reset",
        "replicas": [{"url": url, **report} for url, report in zip(urls, outcomes)],  # type: ignore[dict-item]
    }


def add_admin_routes(app: FastAPI, generator: TritonGenerator) -> None:
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        return JSONResponse(await reset_all(generator, request.headers.get(ADMIN_KEY_HEADER)))

    for path in ("/reset_prefix_cache", "/flush_cache"):
        app.add_api_route(path, reset_prefix_cache, methods=["POST"])
