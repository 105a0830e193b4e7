"""The JSON OpenAI clients expect: whole responses and stream chunks, for completions and for chat.

A sampled choice also says its ``seed`` (the server's choice when the request had none; sending it
back gives the same text): on the choice, and for the first choice at the top as well, in the whole
response and in the chunk that first carries it.

Log-probs: completions give ``tokens``/``token_logprobs``/``text_offset`` (``top_logprobs`` null), chat
gives ``content: [{token, logprob, bytes, top_logprobs: []}]``; alternatives are never produced.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from trispec_openai.choices import Choice, Delta

# the model's finish reasons that OpenAI spells differently (length and stop are the same)
_FINISH = {"cancelled": "abort"}


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else _FINISH.get(reason, reason)


class CompletionFormat:
    object_name = "text_completion"

    def __init__(self, model: str, logprobs: bool) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs

    def _envelope(self, choices: list[dict[str, Any]], object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, tokens: Any, logprobs: Any, offsets: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {
            "tokens": list(tokens),
            "token_logprobs": list(logprobs),
            "top_logprobs": None,
            "text_offset": list(offsets),
        }

    def response(self, choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(
            [
                _seeded(
                    {
                        "index": c.index,
                        "text": c.text,
                        "logprobs": self._logprobs(c.tokens, c.logprobs, c.offsets),
                        "finish_reason": finish_reason(c.finish_reason),
                    },
                    c.seed,
                )
                for c in choices
            ],
            self.object_name,
        )
        return _with_seed(body, choices, usage)

    def opening(self, index: int) -> dict[str, Any] | None:
        return None  # completions stream text from the first chunk on

    def chunk(self, index: int, delta: Delta, reason: str | None) -> dict[str, Any]:
        choice = {
            "index": index,
            "text": delta.text,
            "logprobs": self._logprobs(delta.tokens, delta.logprobs, delta.offsets),
            "finish_reason": finish_reason(reason),
        }
        return _chunk_seed(self._envelope([_seeded(choice, delta.seed)], self.object_name), index, delta)

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope([], self.object_name)
        body["usage"] = usage
        return body


class ChatFormat(CompletionFormat):
    object_name = "chat.completion"

    def __init__(self, model: str, logprobs: bool) -> None:
        super().__init__(model, logprobs)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"

    def _content_logprobs(self, tokens: Any, logprobs: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs)
        ]
        return {"content": content, "refusal": None}

    def response(self, choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(
            [
                _seeded(
                    {
                        "index": c.index,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": self._content_logprobs(c.tokens, c.logprobs),
                        "finish_reason": finish_reason(c.finish_reason),
                    },
                    c.seed,
                )
                for c in choices
            ],
            self.object_name,
        )
        return _with_seed(body, choices, usage)

    def opening(self, index: int) -> dict[str, Any] | None:
        # OpenAI's first chunk of each choice names the role, with empty content
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._envelope([choice], "chat.completion.chunk")

    def chunk(self, index: int, delta: Delta, reason: str | None) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": {"content": delta.text} if delta.text else {},
            "logprobs": self._content_logprobs(delta.tokens, delta.logprobs),
            "finish_reason": finish_reason(reason),
        }
        body = self._envelope([_seeded(choice, delta.seed)], "chat.completion.chunk")
        return _chunk_seed(body, index, delta)

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope([], "chat.completion.chunk")
        body["usage"] = usage
        return body


def _seeded(choice: dict[str, Any], seed: int | None) -> dict[str, Any]:
    if seed is not None:
        choice["seed"] = seed
    return choice


def _with_seed(body: dict[str, Any], choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
    first = next((c for c in choices if c.index == 0), None)
    if first is not None and first.seed is not None:
        body["seed"] = first.seed
    body["usage"] = usage
    return body


def _chunk_seed(body: dict[str, Any], index: int, delta: Delta) -> dict[str, Any]:
    if index == 0 and delta.seed is not None:
        body["seed"] = delta.seed
    return body
