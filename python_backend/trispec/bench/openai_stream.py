"""The one OpenAI client every served arm of ``specdec-bench-served`` goes through: a streamed
``POST /v1/completions`` (ours from ``specdec-openai``, llama.cpp's from ``llama-server``), timed.

The body is the same for every arm: the prompt as token ids (the target tokenizer's, chat template
applied: both servers take ids as given, so each computes exactly the same prompt), greedy, ``max_tokens``
with the end token ignored (``ignore_eos``: every arm makes the same number of tokens), usage in the
last event; an arm adds only its own fields (ours: ``num_draft_tokens``). Times: when the request was
sent, when the first and the last event with text arrived.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Completion:
    sent_s: float  # perf_counter at the request
    first_s: float  # the first event with text
    last_s: float  # the last event with text
    tokens: int  # usage.completion_tokens
    text: str

    @property
    def ttft_s(self) -> float:
        return self.first_s - self.sent_s

    @property
    def decode_s(self) -> float:
        """First token to last: the decode time of the tokens after the first."""
        return self.last_s - self.first_s


def completion_body(
    model: str, prompt: list[int], max_tokens: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }


def stream_completion(base_url: str, body: Mapping[str, Any], timeout_s: float = 3600.0) -> Completion:
    """Send ``body`` to ``<base_url>/v1/completions`` and read its event stream to the end."""
    where = urlsplit(base_url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=timeout_s)
    try:
        payload = json.dumps(body)
        sent = time.perf_counter()
        connection.request(
            "POST", f"{where.path.rstrip('/')}/v1/completions", payload, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{base_url}: HTTP {response.status}: {response.read()[:500]!r}")
        first = last = None
        parts: list[str] = []
        usage: dict[str, Any] | None = None
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"{base_url}: {event['error']}")
            text = "".join(str(c.get("text") or "") for c in event.get("choices") or [])
            if text:
                last = time.perf_counter()
                first = first if first is not None else last
                parts.append(text)
            if event.get("usage"):
                usage = event["usage"]
    finally:
        connection.close()
    if first is None or last is None:
        raise RuntimeError(f"{base_url}: the stream held no text")
    if usage is None or "completion_tokens" not in usage:
        raise RuntimeError(f"{base_url}: the stream ended without usage (stream_options.include_usage)")
    return Completion(sent, first, last, int(usage["completion_tokens"]), "".join(parts))
