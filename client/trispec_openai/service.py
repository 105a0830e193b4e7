"""One OpenAI call: its Triton requests run together, their pieces fold into choices, and the answer
goes back whole (JSON) or as server-sent events.

A streamed call waits for its first piece before answering, so that a request the model refuses at
once (bad input, overload) still gets its HTTP status; an error after that arrives as an
``{"error": ...}`` event, which the openai client raises. However the call ends (done, failed, the
client went away), every Triton request still running is cancelled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send

from trispec_openai.choices import Choice, usage
from trispec_openai.errors import OpenAIError, invalid
from trispec_openai.formats import CompletionFormat
from trispec_openai.mapping import Job
from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import Piece, TritonGenerator

_END = object()
GUIDE_TENSOR = "guided_decoding_guide"


async def merge(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[tuple[int, Piece]]:
    """Pieces of all streams as they arrive, tagged with the stream's position; the first error is
    raised and, on any exit, the streams still running are cancelled (which cancels their calls)."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(position: int, stream: AsyncIterator[Piece]) -> None:
        try:
            async for piece in stream:
                queue.put_nowait((position, piece))
        except Exception as exc:
            queue.put_nowait((position, exc))
        queue.put_nowait((position, _END))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            position, item = await queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
        # shielded: this also runs when the HTTP client went away and the task is being cancelled
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _until(is_disconnected: Callable[[], Awaitable[bool]], every_s: float = 0.5) -> None:
    while not await is_disconnected():
        await asyncio.sleep(every_s)


async def _guide_named(stream: AsyncIterator[Piece], param: str) -> AsyncIterator[Piece]:
    """The model names the tensor of a refused guide; the client sent an OpenAI field."""
    try:
        async for piece in stream:
            yield piece
    except OpenAIError as exc:
        if exc.param != GUIDE_TENSOR:
            raise
        raise invalid(param + exc.message.removeprefix(GUIDE_TENSOR), param) from None


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


class EventStream(StreamingResponse):
    """Starlette leaves the body iterator suspended when the client disconnects between two events;
    closing it here cancels the Triton requests at once rather than when it is garbage-collected."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]


class Call:
    def __init__(
        self,
        generator: TritonGenerator,
        tokenizer: ServedTokenizer,
        fmt: CompletionFormat,
        jobs: list[Job],
        prompts: Sequence[str | list[int]],
        *,
        logprobs: bool,
        top_logprobs: int = 0,
        include_usage: bool = False,
        predicted: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.prompts = prompts
        self.include_usage = include_usage
        self.predicted = predicted
        self.choices = [
            Choice(job.index, job.prompt_index, echo=job.echo, keep_output=job.keep_output) for job in jobs
        ]
        self._merged = merge(
            [
                _guide_named(
                    generator.stream(
                        job.request,
                        logprobs=logprobs,
                        request_id=f"{fmt.id}-{job.index}",
                        extra=job.penalties,
                        top_logprobs=top_logprobs,
                        # echo with logprobs: the model scores the prompt too
                        prompt_logprobs=logprobs and job.echo is not None,
                    ),
                    job.guide_param,
                )
                for job in jobs
            ]
        )

    def _usage(self) -> dict[str, Any]:
        return usage(self.choices, self.prompts, self.tokenizer, self.predicted)

    async def whole(self, is_disconnected: Callable[[], Awaitable[bool]]) -> Response:
        """The whole answer; if the client goes away first (a client-side timeout), the Triton
        requests are cancelled instead of generating for no one."""
        collecting = asyncio.create_task(self._collect())
        watching = asyncio.create_task(_until(is_disconnected))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (collecting, watching):
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(collecting, watching, return_exceptions=True)
        if not collecting.cancelled():
            return collecting.result()
        return Response(status_code=499)  # nobody reads it: the client has gone

    async def _collect(self) -> Response:
        async for index, piece in self._merged:
            self.choices[index].add(piece, self.tokenizer)
        return JSONResponse(self.fmt.response(self.choices, self._usage()))

    async def streamed(self) -> Response:
        try:
            first = await anext(self._merged)
        except BaseException:
            await self._merged.aclose()
            raise
        return EventStream(self._events(first), media_type="text/event-stream")

    async def _events(self, first: tuple[int, Piece]) -> AsyncIterator[str]:
        try:
            for choice in self.choices:
                opening = self.fmt.opening(choice.index)
                if opening is not None:
                    yield sse(opening)
            item: tuple[int, Piece] | None = first
            while item is not None:
                index, piece = item
                choice = self.choices[index]
                delta = choice.add(piece, self.tokenizer)
                if delta.text or delta.logprobs or delta.seed is not None or piece.final:
                    reason = choice.finish_reason if piece.final else None
                    chunk = self.fmt.chunk(index, delta, reason)
                    if chunk is not None:  # None: a tool call held back until it is whole
                        yield sse(chunk)
                item = await anext(self._merged, None)
            if self.include_usage:
                yield sse(self.fmt.usage_chunk(self._usage()))
        except OpenAIError as exc:
            yield sse(exc.body())
        finally:
            await self._merged.aclose()
        yield sse("[DONE]")
