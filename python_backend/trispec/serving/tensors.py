"""The served model's tensors: NVIDIA's ``tensorrt_llm_bls`` contract, plus our own outputs.

One table drives the generated config.pbtxt, the parsing of requests and docs/serving.md's tensor table, so
the three never drift. Every input and output of the BLS model (TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/config.pbtxt``) is declared with its
dtype and dims, so a BLS client never meets "unexpected inference input/output". Each is either the
same as there, our extension, or refused: an input we cannot honour is refused with a message saying
why (INVALID_ARG), never silently ignored.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from trispec.config import GenerationDefaults
from trispec.errors import InvalidInputError
from trispec.request import GenerationRequest
from trispec.stats import AcceptanceStats

# how a tensor relates to tensorrt_llm_bls: the same meaning, ours only, or refused (``why`` says why)
Status = Literal["same", "extension", "refused"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    # Triton's config type name: TYPE_STRING, TYPE_INT32, ...
    triton_type: str
    # per-request dims, after Triton's batch dimension
    dims: tuple[int, ...] = (1,)
    optional: bool = True
    status: Status = "same"
    # refused: the error message's reason; otherwise a note on a difference from the BLS model
    why: str = ""


_MULTIMODAL = "multimodal inputs are not served: the models here are text-only"
_LORA = "LoRA adapters are not served"
_PTUNING = "prompt tuning (prompt embedding tables) is not served"
_GUIDED = "guided decoding is not served"
_LOGITS = "logits are not returned: the speculative loop keeps them on the engine (use return_log_probs)"

INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", optional=False),
    TensorSpec("decoder_text_input", "TYPE_STRING", status="refused", why="the models are decoder-only"),
    TensorSpec("image_input", "TYPE_FP16", (-1, 3, -1, -1), status="refused", why=_MULTIMODAL),
    TensorSpec("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), status="refused", why=_MULTIMODAL),
    TensorSpec("image_url_input", "TYPE_STRING", status="refused", why=_MULTIMODAL),
    TensorSpec("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), status="refused", why=_MULTIMODAL),
    # required by the BLS model; here it defaults to the YAML's defaults.max_tokens
    TensorSpec("max_tokens", "TYPE_INT32"),
    TensorSpec("bad_words", "TYPE_STRING", (-1,)),
    TensorSpec("stop_words", "TYPE_STRING", (-1,)),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL"),
    TensorSpec("end_id", "TYPE_INT32"),
    # outputs are text, never padded token arrays: nothing to pad
    TensorSpec("pad_id", "TYPE_INT32"),
    TensorSpec("top_k", "TYPE_INT32"),
    TensorSpec("top_p", "TYPE_FP32"),
    TensorSpec("temperature", "TYPE_FP32"),
    # as in TensorRT-LLM it only weighs beams, and beam_width is 1
    TensorSpec("length_penalty", "TYPE_FP32"),
    TensorSpec("repetition_penalty", "TYPE_FP32"),
    TensorSpec("min_tokens", "TYPE_INT32"),
    TensorSpec("min_length", "TYPE_INT32", status="extension", why="the older BLS name of min_tokens"),
    TensorSpec("presence_penalty", "TYPE_FP32"),
    TensorSpec("frequency_penalty", "TYPE_FP32"),
    TensorSpec("seed", "TYPE_UINT64"),
    TensorSpec("random_seed", "TYPE_UINT64", status="extension", why="the older BLS name of seed"),
    TensorSpec("return_log_probs", "TYPE_BOOL"),
    TensorSpec("return_context_logits", "TYPE_BOOL", status="refused", why=_LOGITS),
    TensorSpec("return_generation_logits", "TYPE_BOOL", status="refused", why=_LOGITS),
    TensorSpec("num_return_sequences", "TYPE_INT32"),
    TensorSpec("beam_width", "TYPE_INT32", why="only 1: speculative decoding here is not beam search"),
    TensorSpec("stream", "TYPE_BOOL"),
    TensorSpec("prompt_embedding_table", "TYPE_FP16", (-1, -1), status="refused", why=_PTUNING),
    TensorSpec("prompt_vocab_size", "TYPE_INT32", status="refused", why=_PTUNING),
    TensorSpec("prompt_table_extra_id", "TYPE_UINT64", status="refused", why=_PTUNING),
    TensorSpec(
        "embedding_bias_words", "TYPE_STRING", (-1,), status="refused", why="embedding bias is not served"
    ),
    TensorSpec(
        "embedding_bias_weights", "TYPE_FP32", (-1,), status="refused", why="embedding bias is not served"
    ),
    TensorSpec("num_draft_tokens", "TYPE_INT32"),
    # acceptance under sampling always uses the draft's probabilities here; outputs follow the target
    # either way, as in TensorRT-LLM where the flag only changes how many drafts are accepted
    TensorSpec("use_draft_logits", "TYPE_BOOL"),
    TensorSpec("lora_task_id", "TYPE_UINT64", status="refused", why=_LORA),
    TensorSpec("lora_weights", "TYPE_FP16", (-1, -1), status="refused", why=_LORA),
    TensorSpec("lora_config", "TYPE_INT32", (-1, 3), status="refused", why=_LORA),
    TensorSpec("return_perf_metrics", "TYPE_BOOL"),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL"),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL"),
    TensorSpec("guided_decoding_guide_type", "TYPE_STRING", status="refused", why=_GUIDED),
    TensorSpec("guided_decoding_guide", "TYPE_STRING", status="refused", why=_GUIDED),
)

OUTPUTS: tuple[TensorSpec, ...] = (
    # shape [1] per response, as the BLS model sends it (one text per response)
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    # with return_log_probs: the sum so far, and one value per token this response carries
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    # declared so that asking for them is not a Triton error; never sent (the inputs are refused)
    TensorSpec("context_logits", "TYPE_FP32", (-1, -1), status="refused", why=_LOGITS),
    TensorSpec("generation_logits", "TYPE_FP32", (-1, -1, -1), status="refused", why=_LOGITS),
    TensorSpec("batch_index", "TYPE_INT32"),
    TensorSpec("sequence_index", "TYPE_INT32"),
    # with return_perf_metrics: the target KV blocks the sequence holds (no prefix reuse here)
    TensorSpec("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    TensorSpec("kv_cache_reused_blocks", "TYPE_INT32"),
    TensorSpec("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    # with return_perf_metrics: wall-clock times (time.time_ns)
    TensorSpec("arrival_time_ns", "TYPE_INT64"),
    TensorSpec("first_scheduled_time_ns", "TYPE_INT64"),
    TensorSpec("first_token_time_ns", "TYPE_INT64"),
    TensorSpec("last_token_time_ns", "TYPE_INT64"),
    # acceptance over the request so far: on the final response always, on every one with
    # return_perf_metrics
    TensorSpec("acceptance_rate", "TYPE_FP32"),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32"),
    TensorSpec("total_draft_tokens", "TYPE_INT32"),
    TensorSpec("num_input_tokens", "TYPE_INT32"),
    # tokens this response carries (all of them in a one-shot response)
    TensorSpec("num_output_tokens", "TYPE_INT32"),
    # ours: tokens generated so far (cumulative), on every response
    TensorSpec("output_token_count", "TYPE_INT32", status="extension"),
    # ours, on the final response only: why it ended, and acceptance over the WHOLE request
    TensorSpec("finish_reason", "TYPE_STRING", status="extension"),
    TensorSpec("draft_tokens", "TYPE_INT32", status="extension"),
    TensorSpec("accepted_tokens", "TYPE_INT32", status="extension"),
    TensorSpec("verify_rounds", "TYPE_INT32", status="extension"),
    TensorSpec("mean_accepted_length", "TYPE_FP32", status="extension"),
    # the mean number of draft tokens planned per round (adaptive speculation's choice, <= the cap)
    TensorSpec("mean_num_draft_tokens", "TYPE_FP32", status="extension"),
)

REFUSED_INPUTS: tuple[TensorSpec, ...] = tuple(spec for spec in INPUTS if spec.status == "refused")

# most sequences one request may ask for (num_return_sequences); each is a sequence in the batch
MAX_RETURN_SEQUENCES = 16

# the core's field names where they differ from the tensor a client sent
_TENSOR_OF_FIELD = {"prompt": "text_input", "stop": "stop_words"}


def as_tensor_error(error: InvalidInputError) -> InvalidInputError:
    """The same error, naming the tensor the client sent rather than the core's field."""
    tensor = _TENSOR_OF_FIELD.get(error.field)
    return error if tensor is None else InvalidInputError(tensor, error.message)


@dataclass(frozen=True)
class ParsedRequest:
    """One prompt (one row of a request's batch) and what its responses should carry."""

    generation: GenerationRequest
    stream: bool
    exclude_input_in_output: bool
    num_return_sequences: int = 1
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False

    def sequences(self) -> list[GenerationRequest]:
        """The ``num_return_sequences`` independent requests of this prompt. A seeded request's i-th
        sequence draws with seed + i (mod 2**64), so the first is the request as sent."""
        seed = self.generation.seed
        return [
            self.generation if i == 0 or seed is None else replace(self.generation, seed=(seed + i) % 2**64)
            for i in range(self.num_return_sequences)
        ]


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


def _bool(get: GetInput, name: str, default: bool = False) -> bool:
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


def _alias(get: GetInput, name: str, alias: str) -> int | None:
    """An input that also has an older BLS name: either may be sent, both only if equal."""
    value, old = _int(get, name), _int(get, alias)
    if value is not None and old is not None and value != old:
        raise InvalidInputError(name, f"{name} ({value}) and {alias} ({old}) differ")
    return value if value is not None else old


def _check_refused(get: GetInput) -> None:
    """Refuse an input we cannot honour. A false flag or an empty string asks for nothing, so it
    passes (BLS clients often send ``return_context_logits: false`` or ``decoder_text_input: ""``)."""
    for spec in REFUSED_INPUTS:
        array = get(spec.name)
        if array is None or array.size == 0:
            continue
        if spec.triton_type == "TYPE_BOOL" and not array.any():
            continue
        if spec.triton_type == "TYPE_STRING" and all(_text(spec.name, v) == "" for v in array.reshape(-1)):
            continue
        raise InvalidInputError(spec.name, f"not supported: {spec.why}")


# request parameters Triton itself sets (tritonclient's streaming option); any other parameter is
# a key the model does not know, e.g. a misspelled JSON key over HTTP
TRITON_PARAMETER_PREFIX = "triton_"


def check_parameters(parameters_json: str) -> None:
    """Refuse request parameters the model does not read. Over HTTP, Triton turns every JSON key that
    is not an input into a parameter: a misspelled ``max_token`` would otherwise be ignored."""
    parameters = json.loads(parameters_json) if parameters_json else {}
    unknown = sorted(k for k in parameters if not k.startswith(TRITON_PARAMETER_PREFIX))
    if unknown:
        known = ", ".join(spec.name for spec in INPUTS if spec.status != "refused")
        raise InvalidInputError(
            unknown[0], f"unknown input or parameter (known inputs: {known})", reason="unknown_parameter"
        )


def parse_inputs(
    get: GetInput, defaults: GenerationDefaults, max_prompt_bytes: int | None = None
) -> ParsedRequest:
    """Turn one prompt's tensors into a ``GenerationRequest``; unset fields take the YAML defaults.
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
    _check_refused(get)
    prompt = _text("text_input", prompt_value)
    if not prompt:
        raise InvalidInputError("text_input", "must not be empty")
    beam_width = _int(get, "beam_width")
    if beam_width is not None and beam_width != 1:
        raise InvalidInputError("beam_width", f"only 1 is supported (no beam search), got {beam_width}")
    n = _int(get, "num_return_sequences")
    if n is not None and not 1 <= n <= MAX_RETURN_SEQUENCES:
        raise InvalidInputError("num_return_sequences", f"must be in [1, {MAX_RETURN_SEQUENCES}], got {n}")
    # read only to check they are numbers: pad_id pads nothing here, length_penalty weighs beams
    _int(get, "pad_id")
    _float(get, "length_penalty")
    _bool(get, "use_draft_logits")
    min_tokens = _alias(get, "min_tokens", "min_length")
    if min_tokens is not None and min_tokens < 0:
        raise InvalidInputError("min_tokens", f"must be >= 0, got {min_tokens}")

    def pick(value: float | int | None, default: float | int) -> float | int:
        return default if value is None else value

    generation = GenerationRequest(
        prompt=prompt,
        max_tokens=int(pick(_int(get, "max_tokens"), defaults.max_tokens)),
        num_draft_tokens=_int(get, "num_draft_tokens"),
        temperature=float(pick(_float(get, "temperature"), defaults.temperature)),
        top_k=int(pick(_int(get, "top_k"), defaults.top_k)),
        top_p=float(pick(_float(get, "top_p"), defaults.top_p)),
        seed=_alias(get, "seed", "random_seed"),
        stop=tuple(_words(get, "stop_words")),
        bad_words=tuple(_words(get, "bad_words")),
        # -1: no end id at all (TensorRT-LLM's meaning); the core takes it as is
        end_id=_int(get, "end_id"),
        repetition_penalty=float(pick(_float(get, "repetition_penalty"), 1.0)),
        presence_penalty=float(pick(_float(get, "presence_penalty"), 0.0)),
        frequency_penalty=float(pick(_float(get, "frequency_penalty"), 0.0)),
        min_tokens=int(pick(min_tokens, 0)),
        return_log_probs=_bool(get, "return_log_probs"),
    )
    generation.sampling  # noqa: B018 -- validates the sampling fields (names the field)
    return ParsedRequest(
        generation=generation,
        stream=_bool(get, "stream"),
        exclude_input_in_output=_bool(get, "exclude_input_in_output"),
        num_return_sequences=1 if n is None else n,
        return_perf_metrics=_bool(get, "return_perf_metrics"),
        return_num_input_tokens=_bool(get, "return_num_input_tokens"),
        return_num_output_tokens=_bool(get, "return_num_output_tokens"),
    )


def parse_batch(
    get: GetInput, defaults: GenerationDefaults, max_prompt_bytes: int | None = None
) -> list[ParsedRequest]:
    """A request's rows (Triton's batch dimension: NVIDIA's client sends several prompts as one
    request with ``--batch-inputs``), each parsed on its own; the list index is the ``batch_index``."""
    prompts = get("text_input")
    if prompts is None:
        raise InvalidInputError("text_input", "is required")
    rows = prompts.shape[0] if prompts.ndim > 1 else 1

    def row_of(row: int) -> GetInput:
        def get_row(name: str) -> np.ndarray | None:
            array = get(name)
            # Triton checks every batched input has the same batch size
            return array if array is None or rows == 1 else array[row : row + 1]

        return get_row

    return [parse_inputs(row_of(row), defaults, max_prompt_bytes) for row in range(rows)]


_ONE_RESPONSE = "needs serving.decoupled: true (this model sends exactly one response per request)"


def check_one_response(rows: list[ParsedRequest]) -> None:
    """For a model that is not decoupled: refuse what would need more than one response."""
    if any(row.stream for row in rows):
        raise InvalidInputError("stream", f"streaming {_ONE_RESPONSE}")
    if len(rows) > 1:
        raise InvalidInputError("text_input", f"a batch of {len(rows)} prompts {_ONE_RESPONSE}")
    if rows[0].num_return_sequences > 1:
        raise InvalidInputError("num_return_sequences", f"more than one sequence {_ONE_RESPONSE}")


@dataclass(frozen=True)
class PerfMetrics:
    """What ``return_perf_metrics`` reports for one sequence (times: time.time_ns)."""

    arrival_ns: int
    first_scheduled_ns: int
    first_token_ns: int
    last_token_ns: int
    # target KV blocks the sequence's tokens take
    kv_blocks: int


def _cell(value: object, dtype: type | str) -> np.ndarray:
    # [batch 1, 1 value]: one row of the batch per response
    return np.array([[value]], dtype=dtype)


def response_tensors(
    text: str,
    token_count: int,
    finish_reason: str | None = None,
    stats: AcceptanceStats | None = None,
    *,
    batch_index: int = 0,
    sequence_index: int = 0,
    log_probs: Sequence[float] | None = None,
    cum_log_prob: float = 0.0,
    perf: PerfMetrics | None = None,
    num_input_tokens: int | None = None,
    num_output_tokens: int | None = None,
) -> dict[str, np.ndarray]:
    """Output tensors of one response. ``finish_reason`` and ``stats`` on the final one; ``stats`` so
    far with ``perf``; ``log_probs`` (this response's tokens) when the request asked for them."""
    tensors = {
        # [1], as the BLS model's postprocessing sends it: clients do ``output[0].decode()``
        "text_output": np.array([text.encode("utf-8")], dtype=object),
        "output_token_count": _cell(token_count, np.int32),
        "batch_index": _cell(batch_index, np.int32),
        "sequence_index": _cell(sequence_index, np.int32),
    }
    if log_probs is not None:
        tensors["cum_log_probs"] = _cell(cum_log_prob, np.float32)
        # [batch, beam, tokens]
        tensors["output_log_probs"] = np.array([[list(log_probs)]], dtype=np.float32).reshape(1, 1, -1)
    if num_input_tokens is not None:
        tensors["num_input_tokens"] = _cell(num_input_tokens, np.int32)
    if num_output_tokens is not None:
        tensors["num_output_tokens"] = _cell(num_output_tokens, np.int32)
    if perf is not None:
        tensors.update(
            kv_cache_alloc_new_blocks=_cell(perf.kv_blocks, np.int32),
            kv_cache_reused_blocks=_cell(0, np.int32),
            kv_cache_alloc_total_blocks=_cell(perf.kv_blocks, np.int32),
            arrival_time_ns=_cell(perf.arrival_ns, np.int64),
            first_scheduled_time_ns=_cell(perf.first_scheduled_ns, np.int64),
            first_token_time_ns=_cell(perf.first_token_ns, np.int64),
            last_token_time_ns=_cell(perf.last_token_ns, np.int64),
        )
    if stats is not None and (perf is not None or finish_reason is not None):
        tensors.update(
            acceptance_rate=_cell(stats.acceptance_rate, np.float32),
            total_accepted_draft_tokens=_cell(stats.accepted_tokens, np.int32),
            total_draft_tokens=_cell(stats.draft_tokens, np.int32),
        )
    if finish_reason is not None:
        tensors["finish_reason"] = _cell(finish_reason.encode("utf-8"), object)
    if finish_reason is not None and stats is not None:
        tensors.update(
            draft_tokens=_cell(stats.draft_tokens, np.int32),
            accepted_tokens=_cell(stats.accepted_tokens, np.int32),
            verify_rounds=_cell(stats.rounds, np.int32),
            mean_accepted_length=_cell(stats.mean_accepted_length, np.float32),
            mean_num_draft_tokens=_cell(stats.mean_num_draft_tokens, np.float32),
        )
    return tensors
