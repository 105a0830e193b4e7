"""The JSON OpenAI clients expect: whole responses and stream chunks, for completions and for chat.

A sampled choice also says its ``seed`` (the server's choice when the request had none; sending it
back gives the same text): on the choice, and for the first choice at the top as well, in the whole
response and in the chunk that first carries it.

Log-probs: completions give ``tokens``/``token_logprobs``/``text_offset`` and, for ``logprobs`` N > 0,
``top_logprobs`` (one ``{token: logprob}`` per token; null for 0); chat gives ``content: [{token,
logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}]``, the list as long as ``top_logprobs``
asks (shorter where top-k or top-p leave fewer tokens). Alternatives are the most likely tokens under
the distribution the token's own log-prob comes from, so a sampled token may rank outside them.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from trispec_openai.choices import Alternative, Choice, Delta
from trispec_openai.structured import TOOL_CALL_TAG, ToolCalls

_TAGGED = re.compile(TOOL_CALL_TAG + r".*?</tool_call>", re.DOTALL)

# the model's finish reasons that OpenAI spells differently (length and stop are the same)
_FINISH = {"cancelled": "abort"}


def _rows(top: Any, count: int) -> list[tuple[Alternative, ...] | None]:
    """Each token's alternatives (none where none were sent)."""
    rows = list(top)
    return rows + [()] * (count - len(rows))


def _by_token(row: tuple[Alternative, ...] | None) -> dict[str, float] | None:
    """Most likely first; two ids of the same text keep the more likely one's log-prob (None: an
    echoed prompt's first token, which has nothing before it)."""
    if row is None:
        return None
    named: dict[str, float] = {}
    for a in row:
        named.setdefault(a.token, a.logprob)
    return named


def _alternative(a: Alternative) -> dict[str, Any]:
    return {"token": a.token, "logprob": a.logprob, "bytes": list(a.bytes)}


def finish_reason(reason: str | None) -> str | None:
    return None if reason is None else _FINISH.get(reason, reason)


class CompletionFormat:
    object_name = "text_completion"

    def __init__(self, model: str, logprobs: bool, top_logprobs: int = 0) -> None:
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.logprobs = logprobs
        self.top_logprobs = top_logprobs

    def _envelope(self, choices: list[dict[str, Any]], object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, tokens: Any, logprobs: Any, offsets: Any, top: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        alternatives = None
        if self.top_logprobs:
            alternatives = [_by_token(row) for row in _rows(top, len(tokens))]
        return {
            "tokens": list(tokens),
            "token_logprobs": list(logprobs),
            "top_logprobs": alternatives,
            "text_offset": list(offsets),
        }

    def response(self, choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(
            [
                _seeded(
                    {
                        "index": c.index,
                        "text": c.text,
                        "logprobs": self._logprobs(c.tokens, c.logprobs, c.offsets, c.top),
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
            "logprobs": self._logprobs(delta.tokens, delta.logprobs, delta.offsets, delta.top),
            "finish_reason": finish_reason(reason),
        }
        return _chunk_seed(self._envelope([_seeded(choice, delta.seed)], self.object_name), index, delta)

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope([], self.object_name)
        body["usage"] = usage
        return body


class ChatFormat(CompletionFormat):
    object_name = "chat.completion"

    def __init__(
        self, model: str, logprobs: bool, tools: ToolCalls | None = None, top_logprobs: int = 0
    ) -> None:
        super().__init__(model, logprobs, top_logprobs)
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        # a tools request: the answer's text becomes tool_calls; streamed, a named function's arguments
        # go out as they come, other calls whole at the end (their text is kept here until then)
        self.tools = tools
        self._held: dict[int, str] = {}
        self._call_ids: dict[int, str] = {}

    def _message(self, text: str, reason: str | None) -> tuple[dict[str, Any], str | None]:
        calls = self.tools.calls(text) if self.tools is not None and reason in ("stop", None) else None
        if not calls:
            return {"role": "assistant", "content": text}, reason
        content = (
            _TAGGED.sub("", text).strip() or None if self.tools and self.tools.mode == "tagged" else None
        )
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"

    def _content_logprobs(self, tokens: Any, logprobs: Any, top: Any) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = [
            {
                "token": t,
                "logprob": lp,
                "bytes": list(t.encode("utf-8")),
                "top_logprobs": [_alternative(a) for a in row or ()],
            }
            for t, lp, row in zip(tokens, logprobs, _rows(top, len(tokens)))
        ]
        return {"content": content, "refusal": None}

    def response(self, choices: list[Choice], usage: dict[str, Any]) -> dict[str, Any]:
        answers = []
        for c in choices:
            message, reason = self._message(c.text, finish_reason(c.finish_reason))
            answer = {
                "index": c.index,
                "message": message,
                "logprobs": self._content_logprobs(c.tokens, c.logprobs, c.top),
                "finish_reason": reason,
            }
            answers.append(_seeded(answer, c.seed))
        return _with_seed(self._envelope(answers, self.object_name), choices, usage)

    def opening(self, index: int) -> dict[str, Any] | None:
        # OpenAI's first chunk of each choice names the role, with empty content
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._envelope([choice], "chat.completion.chunk")

    def chunk(self, index: int, delta: Delta, reason: str | None) -> dict[str, Any] | None:
        reason = finish_reason(reason)
        content: dict[str, Any] = {"content": delta.text} if delta.text else {}
        if self.tools is not None and self.tools.mode == "named":
            content = self._arguments(index, delta.text)
            reason = "tool_calls" if reason == "stop" else reason
        elif self.tools is not None:
            self._held[index] = self._held.get(index, "") + delta.text
            if reason is None:
                return None
            message, reason = self._message(self._held.pop(index), reason)
            content = {k: v for k, v in message.items() if k != "role" and v is not None}
            for i, call in enumerate(content.get("tool_calls", ())):
                call["index"] = i
        choice = {
            "index": index,
            "delta": content,
            "logprobs": self._content_logprobs(delta.tokens, delta.logprobs, delta.top),
            "finish_reason": reason,
        }
        body = self._envelope([_seeded(choice, delta.seed)], "chat.completion.chunk")
        return _chunk_seed(body, index, delta)

    def _arguments(self, index: int, text: str) -> dict[str, Any]:
        """A streamed piece of a named function's arguments: the first names the call."""
        if index in self._call_ids:
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]} if text else {}
        assert self.tools is not None
        self._call_ids[index] = f"call_{uuid.uuid4().hex[:24]}"
        function = {"name": self.tools.name, "arguments": text}
        return {
            "tool_calls": [
                {"index": 0, "id": self._call_ids[index], "type": "function", "function": function}
            ]
        }

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
