"""What a caller asks for, and the checks that turn bad input into a typed error naming the field.

Validation happens before a request enters the batch, so a bad request never disturbs running ones.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trispec.errors import InvalidInputError
from trispec.guided.spec import Guide
from trispec.sampling_params import SamplingParams

MAX_CACHE_SALT_CHARS = 1024


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str = ""
    # token ids instead of text (then ``prompt`` is ignored)
    prompt_token_ids: Sequence[int] | None = None
    max_tokens: int = 64
    # draft tokens per round; None: the configured default; 0: plain decoding in the same loop
    num_draft_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    # override the tokenizer's end-of-sequence ids with this one id; -1: no end id at all (only
    # max_tokens and stop strings end the request), as TensorRT-LLM's end_id -1
    end_id: int | None = None
    # words never emitted: each is tokenised as given and its token sequence is never produced
    bad_words: Sequence[str] = field(default_factory=tuple)
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # added to these tokens' logits before anything else (OpenAI's logit_bias: token id -> bias; -100
    # all but bans a token, 100 all but forces it)
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    # TensorRT-LLM's embedding bias: each word tokenised as a prompt is (its preprocessing encodes it
    # with the tokenizer's defaults), and each of its tokens' logits gets the weight added
    embedding_bias: Sequence[tuple[str, float]] = ()
    # end ids are not emitted before this many tokens
    min_tokens: int = 0
    # OpenAI's predicted output: text the answer is expected to repeat much of; drafts are copied
    # from it instead of the server's drafter (the target verifies them: the text is unchanged)
    prediction: str = ""
    return_log_probs: bool = False
    # with return_log_probs: the this-many most likely tokens at each position too (up to 20)
    top_log_probs: int = 0
    # the log-prob of each prompt token after the first (OpenAI's echo with logprobs); the prompt is
    # then computed whole, not taken from the prefix cache
    prompt_log_probs: bool = False
    # a resumed stream: the text of the first this-many output tokens is not returned (the caller has
    # it); they are generated as usual, and their text comes back in ``RequestOutput.skipped_text``
    skip_output_tokens: int = 0
    # guided decoding: every output token follows this JSON schema, regex or grammar
    guide: Guide | None = None
    # the prefix cache shares KV blocks only among requests with the same salt (None: the shared
    # namespace of requests without one); a tenant's salt keeps others from timing its prompts
    cache_salt: str | None = None

    @property
    def sampling(self) -> SamplingParams:
        """The request's own sampling settings (the scheduler adds what depends on the tokenizer)."""
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            return_log_probs=self.return_log_probs,
            top_log_probs=self.top_log_probs,
            prompt_log_probs=self.prompt_log_probs,
            min_tokens=self.min_tokens,
        )


@dataclass(frozen=True)
class Limits:
    """What the running engines allow; requests are checked against it."""

    max_context: int
    max_num_draft_tokens: int
    default_num_draft_tokens: int
    vocab_size: int
    # what bounds max_context, named in the refusal
    context_note: str = ""

    @property
    def context(self) -> str:
        return f"{self.max_context} tokens" + (f": {self.context_note}" if self.context_note else "")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_request(request: GenerationRequest, prompt_ids: Sequence[int], limits: Limits) -> int:
    """Raise ``InvalidInputError`` for bad fields; return the effective num_draft_tokens."""
    field_name = "prompt_token_ids" if request.prompt_token_ids is not None else "prompt"
    if len(prompt_ids) == 0:
        raise InvalidInputError(field_name, "must not be empty")
    if any(not _is_int(t) or not 0 <= t < limits.vocab_size for t in prompt_ids):
        raise InvalidInputError(field_name, f"token ids must be integers in [0, {limits.vocab_size})")
    if len(prompt_ids) >= limits.max_context:
        raise InvalidInputError(
            field_name,
            f"{len(prompt_ids)} tokens is longer than the context ({limits.context})",
            reason="too_long",
        )
    if not _is_int(request.max_tokens) or request.max_tokens <= 0:
        raise InvalidInputError("max_tokens", f"must be a positive integer, got {request.max_tokens!r}")
    if len(prompt_ids) + request.max_tokens > limits.max_context:
        raise InvalidInputError(
            "max_tokens",
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({request.max_tokens}) exceeds the context "
            f"({limits.context})",
            reason="too_long",
        )
    if not _is_int(request.skip_output_tokens) or request.skip_output_tokens < 0:
        raise InvalidInputError(
            "skip_output_tokens", f"must be an integer >= 0, got {request.skip_output_tokens!r}"
        )
    if request.cache_salt is not None and (
        not isinstance(request.cache_salt, str) or not 0 < len(request.cache_salt) <= MAX_CACHE_SALT_CHARS
    ):
        raise InvalidInputError(
            "cache_salt", f"must be a non-empty string of at most {MAX_CACHE_SALT_CHARS} characters, if given"
        )
    k = request.num_draft_tokens
    if k is not None and (not _is_int(k) or not 0 <= k <= limits.max_num_draft_tokens):
        raise InvalidInputError(
            "num_draft_tokens", f"must be an integer in [0, {limits.max_num_draft_tokens}], got {k!r}"
        )
    request.sampling  # noqa: B018 -- SamplingParams validates temperature, top_k, top_p and seed
    if isinstance(request.stop, str) or any(not isinstance(s, str) or s == "" for s in request.stop):
        raise InvalidInputError("stop", "must be a list of non-empty strings")
    # an id past the vocabulary is taken, as TensorRT-LLM takes it: never generated, so no end id
    # (SGLang's benchmark sends 1048576 to make every request run its max_tokens)
    if request.end_id is not None and (not _is_int(request.end_id) or request.end_id < -1):
        raise InvalidInputError("end_id", "must be a token id (>= 0), or -1 for none")
    if isinstance(request.bad_words, str) or any(
        not isinstance(w, str) or w == "" for w in request.bad_words
    ):
        raise InvalidInputError("bad_words", "must be a list of non-empty strings")
    _check_logit_bias(request, limits.vocab_size)
    if not isinstance(request.prediction, str):
        raise InvalidInputError("prediction", "must be text")
    if request.guide is not None and not isinstance(request.guide, Guide):
        raise InvalidInputError("guided_decoding_guide", "must be a Guide")
    return k if k is not None else min(limits.default_num_draft_tokens, limits.max_num_draft_tokens)


def _check_logit_bias(request: GenerationRequest, vocab_size: int) -> None:
    if not isinstance(request.logit_bias, Mapping):
        raise InvalidInputError("logit_bias", "must map token ids to biases")
    for token, bias in request.logit_bias.items():
        if not _is_int(token) or not 0 <= token < vocab_size:
            raise InvalidInputError(
                "logit_bias", f"token ids must be integers in [0, {vocab_size}), got {token!r}"
            )
        if not _is_finite(bias):
            raise InvalidInputError("logit_bias", f"biases must be finite numbers, got {bias!r}")
    for word, weight in request.embedding_bias:
        if not isinstance(word, str) or not word:
            raise InvalidInputError("embedding_bias_words", "must be non-empty strings")
        if not _is_finite(weight):
            raise InvalidInputError("embedding_bias_weights", f"must be finite numbers, got {weight!r}")


def _is_finite(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
