"""OpenAI request bodies, validated: a bad field fails here with its name (400), before Triton sees it.

Fields that would change the answer in a way we cannot honour (``suffix``) are refused with
the reason rather than ignored (``response_format`` and ``tools`` are served: trispec_openai.structured);
``user``, ``metadata`` and ``store`` change nothing and are accepted. Unknown keys are refused, so that a
misspelled field is not silently ignored. Our extensions: ``num_draft_tokens`` and ``top_k``; and
vLLM's ``cache_salt`` (KV-cache blocks are shared only among requests with the same salt).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trispec_openai.errors import invalid, unsupported

# how many choices (n x prompts) one request may fan out into at Triton
MAX_CHOICES = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Prediction(_Body):
    type: Literal["content"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Sampling(_Body):
    """What completions and chat share."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    # Triton's seed is UINT64; choice i of n is seeded with seed + i
    seed: int | None = Field(None, ge=0, le=2**64 - 1 - MAX_CHOICES)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # passed to the model's penalties of the same names (0 = off)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # extensions: draft tokens per round (0 = plain decoding; default: the server's), top-k sampling
    num_draft_tokens: int | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    # vLLM's name: the prefix cache shares KV blocks only among requests with the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    # vLLM's extra sampling parameters (its and SGLang's benchmarks send ignore_eos): no end id,
    # end ids held back until min_tokens, the model's repetition penalty
    ignore_eos: bool = False
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0)
    # Predicted Outputs: text the answer should repeat much of; the server drafts from it
    prediction: Prediction | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> _Sampling:
        for token, bias in (self.logit_bias or {}).items():
            if not token.isdigit() or int(token) >= 2**31:
                raise invalid(f"logit_bias: keys must be token ids, got {token!r}", "logit_bias")
            if not -100 <= bias <= 100:
                raise invalid(f"logit_bias: biases must be in [-100, 100], got {bias}", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise unsupported("stream_options", "only goes with stream: true")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    # text, token ids (one prompt), or a list of either; list[Any]: our check names what is wrong
    prompt: str | list[Any]
    # 0 only with echo: the prompt scored, nothing generated
    max_tokens: int | None = Field(None, ge=0)
    # the log-prob of each generated token and, for N > 0, the N most likely tokens at each
    logprobs: int | None = Field(None, ge=0, le=5)
    # the prompt before each answer; with logprobs, its tokens' log-probs too (the first: null)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        prompts = self.prompts
        if not prompts or not all(_is_prompt(p) for p in prompts):
            raise invalid(
                "prompt: must be a non-empty string, a non-empty list of token ids, or a list of either",
                "prompt",
            )
        if len(prompts) * self.n > MAX_CHOICES:
            raise unsupported("n", f"prompts x n is {len(prompts) * self.n}, over {MAX_CHOICES}")
        if self.max_tokens == 0 and not self.echo:
            raise unsupported("max_tokens", "0 only goes with echo: true (the prompt alone, none generated)")
        if self.suffix:
            raise unsupported("suffix", "insertion is not supported; leave it out")
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", "only best_of equal to n is supported (no ranking of candidates)")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One prompt per entry: text, or the token ids of the served tokenizer."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and all(_is_token(t) for t in prompt)):
            return [prompt]
        return list(prompt)


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _is_prompt(value: object) -> bool:
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(_is_token(t) for t in value)


class ChatMessage(BaseModel):
    # extra keys (name, tool_call_id, ...) pass through to the chat template as Hugging Face does
    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1)
    content: str | list[TextPart] | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as a template reads it: content a plain string (text parts joined)."""
        data = self.model_dump(exclude_none=True)
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        data["content"] = content or ""
        return data


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # structured output and tool calls (trispec_openai.structured)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    # one call per choice is what the grammar produces; true or false changes nothing else
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    # vLLM's: more variables the chat template reads (e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise unsupported("top_logprobs", "needs logprobs: true")
        return self

    @property
    def token_limit(self) -> int | None:
        # max_tokens is deprecated for chat in favour of max_completion_tokens; either is honoured
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# vLLM's tokenizer routes (trispec_openai.tokenizer_routes)
class TokenizeRequest(_Body):
    model: str | None = None
    # one of the two: text, or chat messages rendered as /v1/chat/completions renders them
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    # default: True for a prompt (BOS where the model adds one), False for messages (the template has them)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise invalid("give prompt or messages (one of them)", "prompt")
        if self.messages is not None and not self.add_generation_prompt:
            message = "add_generation_prompt: only true (the turn the model answers)"
            raise invalid(message, "add_generation_prompt")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
