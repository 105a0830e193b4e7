"""Chat messages → the prompt text, through the model's own chat template.

The template is the one the served model ships: ``tokenizer.chat_template`` of its GGUF or the
``chat_template`` of a Hugging Face tokenizer_config.json, found the way the server finds the tokenizer
(``trispec.checkpoints.load_tokenizer`` on the same YAML). It is rendered as transformers renders it:
a sandboxed jinja2 environment with ``trim_blocks``/``lstrip_blocks``, the loop-controls extension,
``raise_exception``, ``strftime_now`` and a ``tojson`` that keeps non-ASCII text (Llama 3 and Qwen
templates use the last three).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trispec_openai.errors import OpenAIError, invalid


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One compiled template with the special tokens it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        self.source = source
        self._template = env.from_string(source)
        self._special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt for ``messages``, ending with the assistant's turn opened (add_generation_prompt);
        ``tools`` as Hugging Face passes them (a template that does not read them leaves them out);
        ``variables``: more the template may read (vLLM's ``chat_template_kwargs``, e.g.
        ``enable_thinking``), never the ones set here."""
        extra = {**(variables or {}), **({} if tools is None else {"tools": tools})}
        fixed = {"messages": [dict(m) for m in messages], "add_generation_prompt": True, **self._special}
        try:
            return self._template.render(**{**extra, **fixed})
        except TemplateError as exc:
            # the template's own raise_exception ("Conversation roles must alternate ...") or a bad shape
            raise invalid(f"messages: the model's chat template refused them: {exc}", "messages") from None


class NoChatTemplate:
    """The model ships no chat template: chat requests are refused, completions still work."""

    source = ""

    def render(self, *_: object) -> str:  # whatever it is given: there is no template to render
        raise OpenAIError(
            400,
            "this model has no chat template in its tokenizer metadata; use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
