"""One generation as a Triton gRPC stream (async tritonclient), read as typed pieces.

Every request is sent with ``stream=true``, also for non-streaming OpenAI calls: each response then
carries the text verified in one round (and its tokens' log-probs), which both kinds of answer are
built from. The request side of the gRPC stream stays open until the final response arrives; closing
the reader early (the HTTP client went away, a sibling choice failed) cancels the call, which cancels
the request in the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc.aio as aiogrpc
from trispec_client.grpc_transport import infer_inputs, response_outputs
from trispec_client.request import GenerationRequest
from trispec_client.results import SpeculationStats, chunk_from_outputs
from tritonclient.utils import InferenceServerException

from trispec_openai.errors import OpenAIError, from_model_message, from_rpc_error

# the model's final response may be flags only; asking for it makes the end of a request explicit
_PARAMETERS = {"triton_enable_empty_final_response": True}


@dataclass(frozen=True)
class Piece:
    """One response: the text it adds, the log-probs of the tokens it adds (when asked for) and, on the
    final one, why generation ended and the request's speculation totals."""

    text: str
    token_count: int  # cumulative
    logprobs: tuple[float, ...] = ()
    final: bool = False
    finish_reason: str | None = None
    stats: SpeculationStats | None = None
    # the prompt's length in tokens, from servers that send num_input_tokens
    prompt_tokens: int | None = None


def _ints(value: np.ndarray | None) -> int | None:
    return None if value is None or value.size == 0 else int(value.reshape(-1)[0])


def scalar_input(name: str, value: bool | float) -> aiogrpc.InferInput:
    """A [1, 1] BOOL or FP32 input (the model's max_batch_size leads every shape)."""
    array = np.array([[value]], dtype=np.bool_ if isinstance(value, bool) else np.float32)
    tensor = aiogrpc.InferInput(name, [1, 1], "BOOL" if isinstance(value, bool) else "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


class TritonGenerator:
    """Generations over one gRPC channel to Triton, shared by every HTTP request."""

    def __init__(self, url: str, model: str, timeout_s: float) -> None:
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self._client: aiogrpc.InferenceServerClient | None = None
        self._inputs: frozenset[str] | None = None

    async def open(self) -> None:
        self._client = aiogrpc.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> aiogrpc.InferenceServerClient:
        if self._client is None:
            raise RuntimeError("TritonGenerator.open() was not called")
        return self._client

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_model_ready(self.model, client_timeout=5))
        except Exception:
            return False

    async def model_inputs(self) -> frozenset[str]:
        """The model's input names (asked once): optional flags are sent only to a model that declares
        them, since Triton refuses an undeclared input."""
        if self._inputs is None:
            try:
                metadata = await self.client.get_model_metadata(self.model, as_json=True)
            except InferenceServerException as exc:
                raise OpenAIError(503, f"Triton: {exc.message()}", code="unavailable") from None
            self._inputs = frozenset(tensor["name"] for tensor in metadata.get("inputs", ()))
        return self._inputs

    async def stream(
        self,
        request: GenerationRequest,
        *,
        logprobs: bool,
        request_id: str,
        extra: Sequence[tuple[str, float]] = (),
    ) -> AsyncIterator[Piece]:
        """The request's pieces up to the final one; raises ``OpenAIError`` on any failure. ``extra``:
        FP32 inputs beside the request's own (penalties)."""
        inputs = infer_inputs(request) + [scalar_input(name, value) for name, value in extra]
        declared = await self.model_inputs()
        if logprobs:
            if "return_log_probs" not in declared:
                raise OpenAIError(
                    501, "logprobs: this server's model does not return log-probs", param="logprobs"
                )
            inputs.append(scalar_input("return_log_probs", True))
        if "return_num_input_tokens" in declared:
            inputs.append(scalar_input("return_num_input_tokens", True))
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

        call = self.client.stream_infer(requests(), stream_timeout=self.timeout_s)
        finished = False
        token_count = 0
        try:
            async for result, error in call:
                if error is not None:
                    finished = True  # an error ends the request in the model; nothing to cancel
                    raise from_model_message(error.message() or str(error), declared)
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
                yield Piece(
                    text=chunk.text,
                    token_count=chunk.token_count,
                    logprobs=() if values is None else tuple(float(v) for v in values.reshape(-1)),
                    final=final,
                    finish_reason=chunk.finish_reason,
                    stats=chunk.stats,
                    prompt_tokens=_ints(outputs.get("num_input_tokens")),
                )
                if final:
                    return
            finished = True
            raise OpenAIError(502, "Triton ended the stream before the final response", code="bad_gateway")
        except grpc.aio.AioRpcError as exc:
            finished = True
            raise from_rpc_error(exc) from None
        finally:
            done.set()
            if not finished:
                call.cancel()
