"""What one generation request sends: only the inputs the caller set, typed for Triton.

The server owns the meaning of every value (ranges, defaults); this module only checks that a value can
be carried at all (an int that fits INT32, a seed that fits UINT64, a finite float, strings for stop
words), so that a bad value fails here with the field's name instead of as an opaque encoding error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trispec_client.errors import InvalidRequestError

_INT32 = (-(2**31), 2**31 - 1)
_UINT64 = (0, 2**64 - 1)

# name -> Triton datatype of the optional scalar inputs (the model's config.pbtxt).
_SCALAR_TYPES: dict[str, str] = {
    "max_tokens": "INT32",
    "num_draft_tokens": "INT32",
    "temperature": "FP32",
    "top_k": "INT32",
    "top_p": "FP32",
    "seed": "UINT64",
    "end_id": "INT32",
    "min_tokens": "INT32",
    "stream": "BOOL",
    "exclude_input_in_output": "BOOL",
    "skip_output_tokens": "INT32",
}
# name -> Triton datatype of the optional list inputs sent pairwise (logit_bias)
_LIST_TYPES: dict[str, str] = {"input_ids": "INT32", "logit_bias_ids": "INT32", "logit_bias_values": "FP32"}
_NUMPY_TYPES = {
    "INT32": np.int32,
    "FP32": np.float32,
    "UINT64": np.uint64,
    "BOOL": np.bool_,
    "BYTES": np.object_,
}


@dataclass(frozen=True)
class InputTensor:
    """One named input with its batch dimension (the model has max_batch_size 1): shape [1, n]."""

    name: str
    datatype: str
    array: np.ndarray


@dataclass(frozen=True)
class GenerationRequest:
    """One request to the specdec model. ``None`` / empty means: not sent, the server's default applies."""

    prompt: str
    max_tokens: int | None = None
    num_draft_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    # end ids are held back until this many tokens were generated
    min_tokens: int | None = None
    stop_words: tuple[str, ...] = field(default=())
    bad_words: tuple[str, ...] = field(default=())
    stream: bool = True
    exclude_input_in_output: bool | None = None
    # a resumed stream (trispec_client.resume): the server generates these first tokens again without
    # sending their text
    skip_output_tokens: int | None = None
    # a stream resumed on another replica: the model it began on (the server refuses another one)
    expected_model_fingerprint: str | None = None
    # structured output, as NVIDIA's tensors: json, json_schema, regex or ebnf_grammar, and the schema,
    # regex or grammar (none for json)
    guided_decoding_guide_type: str | None = None
    guided_decoding_guide: str | None = None
    # the prefix cache shares KV blocks only among requests with the same salt (a tenant's secret)
    cache_salt: str | None = None
    # token id -> bias added to its logit (OpenAI's logit_bias), sent as logit_bias_ids / _values
    logit_bias: Mapping[int, float] | None = None
    # the prompt as token ids of the served tokenizer (input_ids), instead of ``prompt`` (then "")
    prompt_token_ids: tuple[int, ...] | None = None
    # a predicted output (OpenAI's Predicted Outputs): the server drafts from it
    prediction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            raise InvalidRequestError(f"text_input: must be a string, got {type(self.prompt).__name__}")
        for name in ("max_tokens", "num_draft_tokens", "top_k", "end_id", "min_tokens"):
            _check_int(name, getattr(self, name), _INT32)
        _check_int("skip_output_tokens", self.skip_output_tokens, (0, _INT32[1]))
        _check_int("seed", self.seed, _UINT64)
        for name in ("temperature", "top_p"):
            _check_float(name, getattr(self, name))
        for name in ("stream", "exclude_input_in_output"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool | np.bool_):
                raise InvalidRequestError(f"{name}: must be a bool, got {value!r}")
        # frozen: normalise the word lists (any iterable of str) through object.__setattr__
        object.__setattr__(self, "stop_words", _check_words("stop_words", self.stop_words))
        object.__setattr__(self, "bad_words", _check_words("bad_words", self.bad_words))
        for name in ("guided_decoding_guide_type", "guided_decoding_guide", "prediction"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(f"{name}: must be a string, got {type(value).__name__}")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise InvalidRequestError(f"cache_salt: must be a non-empty string, got {self.cache_salt!r}")
        if self.prompt_token_ids is not None:
            ids = tuple(self.prompt_token_ids)
            if not ids or self.prompt:
                raise InvalidRequestError("input_ids: give a non-empty list of token ids and an empty prompt")
            for token in ids:
                _check_int("input_ids", token, (0, _INT32[1]))
            object.__setattr__(self, "prompt_token_ids", ids)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise InvalidRequestError("logit_bias: must map token ids to biases")
            for token, bias in self.logit_bias.items():
                _check_int("logit_bias", token, _INT32)
                _check_float("logit_bias", bias)

    @property
    def routing_key(self) -> str:
        """What prefix-affinity routing hashes: the prompt, or its token ids spelled out."""
        ids = self.prompt_token_ids
        return self.prompt if ids is None else " ".join(map(str, ids))

    def sent_values(self) -> dict[str, Any]:
        """The inputs to send, by Triton input name: plain Python values, lists for word lists."""
        ids = self.prompt_token_ids
        values: dict[str, Any] = {"text_input": self.prompt} if ids is None else {"input_ids": list(ids)}
        for name in _SCALAR_TYPES:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        for name in ("stop_words", "bad_words"):
            words = getattr(self, name)
            if words:
                values[name] = list(words)
        for name in (
            "expected_model_fingerprint",
            "guided_decoding_guide_type",
            "guided_decoding_guide",
            "prediction",
        ):
            if getattr(self, name):
                values[name] = getattr(self, name)
        if self.cache_salt is not None:
            values["cache_salt"] = self.cache_salt
        if self.logit_bias:
            values["logit_bias_ids"] = [int(t) for t in self.logit_bias]
            values["logit_bias_values"] = [float(b) for b in self.logit_bias.values()]
        return values

    def json_body(self) -> dict[str, Any]:
        """Body for HTTP ``generate_stream``: input names as keys, scalars as scalars, word lists as lists."""
        return {name: _plain(value) for name, value in self.sent_values().items()}

    def tensors(self) -> list[InputTensor]:
        """Inputs for gRPC, each with the leading batch dimension of 1."""
        result = []
        for name, value in self.sent_values().items():
            if name in _LIST_TYPES:
                datatype = _LIST_TYPES[name]
                result.append(InputTensor(name, datatype, np.array([value], dtype=_NUMPY_TYPES[datatype])))
                continue
            datatype = _SCALAR_TYPES.get(name, "BYTES")
            if datatype == "BYTES":
                items = value if isinstance(value, list) else [value]
                array = np.array([[s.encode("utf-8") for s in items]], dtype=np.object_)
            else:
                array = np.array([[value]], dtype=_NUMPY_TYPES[datatype])
            result.append(InputTensor(name, datatype, array))
        return result


def _check_int(name: str, value: object, bounds: tuple[int, int]) -> None:
    if value is None:
        return
    # bool is an int subclass; True as max_tokens is a caller bug, not 1
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidRequestError(f"{name}: must be an integer, got {value!r}")
    if not bounds[0] <= int(value) <= bounds[1]:
        raise InvalidRequestError(f"{name}: {value} does not fit in [{bounds[0]}, {bounds[1]}]")


def _check_float(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidRequestError(f"{name}: must be a number, got {value!r}")
    if not math.isfinite(float(value)):
        raise InvalidRequestError(f"{name}: must be finite, got {value!r}")


def _check_words(name: str, words: Iterable[str] | str | None) -> tuple[str, ...]:
    if words is None:
        return ()
    # a bare string would otherwise be split into characters
    if isinstance(words, str):
        return (words,)
    result = tuple(words)
    for word in result:
        if not isinstance(word, str) or not word:
            raise InvalidRequestError(f"{name}: every entry must be a non-empty string, got {word!r}")
    return result


def _plain(value: Any) -> Any:
    """numpy scalars → Python scalars so that json.dumps accepts them."""
    return value.item() if isinstance(value, np.generic) else value
