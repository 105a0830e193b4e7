"""The ``specdec`` model's tensors, compatible with NVIDIA's ``tensorrt_llm_bls`` model.

One table drives both the generated config.pbtxt and the parsing of requests, so the two never
drift. Inputs the BLS client family sends that we do not implement are accepted and ignored
(``used=False``, listed in the README); everything we use is validated here or by the core, and a
bad value raises ``InvalidInputError`` naming the tensor.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trispec.config import GenerationDefaults
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest
from trispec.stats import AcceptanceStats


@dataclass(frozen=True)
class TensorSpec:
    name: str
    # Triton's config type name: TYPE_STRING, TYPE_INT32, ...
    triton_type: str
    # per-request dims, after Triton's batch dimension (config max_batch_size is 1)
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    # False: accepted so that existing tensorrt_llm_bls clients work, but ignored
    used: bool = True


INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", optional=False),
    TensorSpec("max_tokens", "TYPE_INT32"),
    TensorSpec("num_draft_tokens", "TYPE_INT32"),
    TensorSpec("temperature", "TYPE_FP32"),
    TensorSpec("top_k", "TYPE_INT32"),
    TensorSpec("top_p", "TYPE_FP32"),
    TensorSpec("seed", "TYPE_UINT64"),
    TensorSpec("random_seed", "TYPE_UINT64"),
    TensorSpec("end_id", "TYPE_INT32"),
    TensorSpec("stop_words", "TYPE_STRING", (-1,)),
    TensorSpec("stream", "TYPE_BOOL"),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL"),
    # checked: only 1 is served (speculative decoding here is not beam search)
    TensorSpec("beam_width", "TYPE_INT32"),
    # accepted and ignored
    TensorSpec("bad_words", "TYPE_STRING", (-1,), used=False),
    TensorSpec("decoder_text_input", "TYPE_STRING", used=False),
    TensorSpec("pad_id", "TYPE_INT32", used=False),
    TensorSpec("length_penalty", "TYPE_FP32", used=False),
    TensorSpec("repetition_penalty", "TYPE_FP32", used=False),
    TensorSpec("min_length", "TYPE_INT32", used=False),
    TensorSpec("presence_penalty", "TYPE_FP32", used=False),
    TensorSpec("frequency_penalty", "TYPE_FP32", used=False),
    TensorSpec("return_log_probs", "TYPE_BOOL", used=False),
    TensorSpec("return_context_logits", "TYPE_BOOL", used=False),
    TensorSpec("return_generation_logits", "TYPE_BOOL", used=False),
    TensorSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), used=False),
    TensorSpec("prompt_vocab_size", "TYPE_INT32", used=False),
    TensorSpec("embedding_bias_words", "TYPE_STRING", (-1,), used=False),
    TensorSpec("embedding_bias_weights", "TYPE_FP32", (-1,), used=False),
    TensorSpec("use_draft_logits", "TYPE_BOOL", used=False),
    TensorSpec("lora_task_id", "TYPE_UINT64", used=False),
)

OUTPUTS: tuple[TensorSpec, ...] = (
    # stream: the text verified this round; otherwise the whole text in one response
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    # tokens generated so far (cumulative)
    TensorSpec("output_token_count", "TYPE_INT32"),
    # on the final response only: why it ended, and acceptance over the WHOLE request
    TensorSpec("finish_reason", "TYPE_STRING"),
    TensorSpec("draft_tokens", "TYPE_INT32"),
    TensorSpec("accepted_tokens", "TYPE_INT32"),
    TensorSpec("verify_rounds", "TYPE_INT32"),
    TensorSpec("acceptance_rate", "TYPE_FP32"),
    TensorSpec("mean_accepted_length", "TYPE_FP32"),
    # the mean number of draft tokens planned per round (adaptive speculation's choice, <= the cap)
    TensorSpec("mean_num_draft_tokens", "TYPE_FP32"),
)

IGNORED_INPUTS: tuple[str, ...] = tuple(spec.name for spec in INPUTS if not spec.used)

# the core's field names where they differ from the tensor a client sent
_TENSOR_OF_FIELD = {"prompt": "text_input", "stop": "stop_words"}


def as_tensor_error(error: InvalidInputError) -> InvalidInputError:
    """The same error, naming the tensor the client sent rather than the core's field."""
    tensor = _TENSOR_OF_FIELD.get(error.field)
    return error if tensor is None else InvalidInputError(tensor, error.message)


@dataclass(frozen=True)
class ParsedRequest:
    generation: GenerationRequest
    stream: bool
    exclude_input_in_output: bool


# How the model reads one input: the tensor as numpy, or None when the client did not send it.
GetInput = Callable[[str], "np.ndarray | None"]


def _one(get: GetInput, name: str) -> object | None:
    array = get(name)
    if array is None:
        return None
    if array.size != 1:
        raise InvalidInputError(name, f"expected one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _text(name: str, value: object) -> str:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(name, "is not valid UTF-8") from None
    return str(value)


def _int(get: GetInput, name: str) -> int | None:
    value = _one(get, name)
    return None if value is None else int(value)  # type: ignore[call-overload]


def _float(get: GetInput, name: str) -> float | None:
    value = _one(get, name)
    if value is None:
        return None
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise InvalidInputError(name, f"must be a finite number, got {number}")
    return number


def _bool(get: GetInput, name: str, default: bool) -> bool:
    value = _one(get, name)
    return default if value is None else bool(value)


def _words(get: GetInput, name: str) -> list[str]:
    """A BLS word list: each string may hold several comma-separated words (CSV, as the BLS
    preprocessing reads it); empty words are dropped (clients often send "")."""
    array = get(name)
    if array is None:
        return []
    words = []
    for item in array.reshape(-1):
        for row in csv.reader([_text(name, item)]):
            words.extend(w for w in row if w)
    return words


def _seed(get: GetInput) -> int | None:
    seed, random_seed = _int(get, "seed"), _int(get, "random_seed")
    if seed is not None and random_seed is not None and seed != random_seed:
        raise InvalidInputError("seed", f"seed ({seed}) and random_seed ({random_seed}) differ")
    return seed if seed is not None else random_seed


# request parameters Triton itself sets (tritonclient's streaming option); any other parameter is
# a key the model does not know, e.g. a misspelled JSON key over HTTP
TRITON_PARAMETER_PREFIX = "triton_"


def check_parameters(parameters_json: str) -> None:
    """Refuse request parameters the model does not read. Over HTTP, Triton turns every JSON key that
    is not an input into a parameter: a misspelled ``max_token`` would otherwise be ignored."""
    parameters = json.loads(parameters_json) if parameters_json else {}
    unknown = sorted(k for k in parameters if not k.startswith(TRITON_PARAMETER_PREFIX))
    if unknown:
        known = ", ".join(spec.name for spec in INPUTS if spec.used)
        raise InvalidInputError(
            unknown[0], f"unknown input or parameter (known inputs: {known})", reason="unknown_parameter"
        )


def parse_inputs(
    get: GetInput, defaults: GenerationDefaults, max_prompt_bytes: int | None = None
) -> ParsedRequest:
    """Turn a request's tensors into a ``GenerationRequest``; unset fields take the YAML defaults.
    A ``text_input`` over ``max_prompt_bytes`` is refused before anything decodes or tokenises it."""
    prompt_value = _one(get, "text_input")
    if prompt_value is None:
        raise InvalidInputError("text_input", "is required")
    if max_prompt_bytes is not None and isinstance(prompt_value, bytes | np.bytes_):
        size = len(prompt_value)
        if size > max_prompt_bytes:
            raise InvalidInputError(
                "text_input",
                f"{size} bytes is over serving.max_prompt_bytes ({max_prompt_bytes})",
                reason="too_long",
            )
    prompt = _text("text_input", prompt_value)
    if not prompt:
        raise InvalidInputError("text_input", "must not be empty")
    beam_width = _int(get, "beam_width")
    if beam_width is not None and beam_width != 1:
        raise InvalidInputError("beam_width", f"only 1 is supported (no beam search), got {beam_width}")

    def pick(value: float | int | None, default: float | int) -> float | int:
        return default if value is None else value

    generation = GenerationRequest(
        prompt=prompt,
        max_tokens=int(pick(_int(get, "max_tokens"), defaults.max_tokens)),
        num_draft_tokens=_int(get, "num_draft_tokens"),
        temperature=float(pick(_float(get, "temperature"), defaults.temperature)),
        top_k=int(pick(_int(get, "top_k"), defaults.top_k)),
        top_p=float(pick(_float(get, "top_p"), defaults.top_p)),
        seed=_seed(get),
        stop=tuple(_words(get, "stop_words")),
        end_id=_int(get, "end_id"),
    )
    generation.sampling  # noqa: B018 -- validates temperature, top_k, top_p, seed (names the field)
    return ParsedRequest(
        generation=generation,
        stream=_bool(get, "stream", default=False),
        exclude_input_in_output=_bool(get, "exclude_input_in_output", default=False),
    )


def _cell(value: object, dtype: type | str) -> np.ndarray:
    # [batch 1, 1 value]: config max_batch_size is 1
    return np.array([[value]], dtype=dtype)


def response_tensors(
    text: str,
    token_count: int,
    finish_reason: str | None = None,
    stats: AcceptanceStats | None = None,
) -> dict[str, np.ndarray]:
    """Output tensors of one response; pass ``finish_reason`` and ``stats`` on the final one."""
    tensors = {
        "text_output": _cell(text.encode("utf-8"), object),
        "output_token_count": _cell(token_count, np.int32),
    }
    if finish_reason is not None:
        tensors["finish_reason"] = _cell(finish_reason.encode("utf-8"), object)
    if stats is not None:
        tensors.update(
            draft_tokens=_cell(stats.draft_tokens, np.int32),
            accepted_tokens=_cell(stats.accepted_tokens, np.int32),
            verify_rounds=_cell(stats.rounds, np.int32),
            acceptance_rate=_cell(stats.acceptance_rate, np.float32),
            mean_accepted_length=_cell(stats.mean_accepted_length, np.float32),
            mean_num_draft_tokens=_cell(stats.mean_num_draft_tokens, np.float32),
        )
    return tensors
