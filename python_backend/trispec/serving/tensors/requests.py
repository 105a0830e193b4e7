"""A request's tensors → ``GenerationRequest``s: the readers, the checks (refused inputs, unknown
parameters, sizes, one response when not decoupled), one ``ParsedRequest`` per row of the batch."""

from __future__ import annotations

import csv
import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from trispec.config import GenerationDefaults
from trispec.errors import InvalidInputError
from trispec.guided import GUIDE_TYPES, Guide
from trispec.request import GenerationRequest
from trispec.serving.tensors.table import INPUTS, REFUSED_INPUTS

# most sequences one request may ask for (num_return_sequences); each is a sequence in the batch
MAX_RETURN_SEQUENCES = 16

# the core's field names where they differ from the tensor a client sent
# (the core checks logit_bias' ids against the vocabulary; its values are checked here)
_TENSOR_OF_FIELD = {
    "prompt": "text_input",
    "prompt_token_ids": "input_ids",
    "stop": "stop_words",
    "logit_bias": "logit_bias_ids",
}


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
    # the request carried skip_output_tokens: a stream resumed after the server cut it (metrics)
    resumed: bool = False
    # this replica's model fingerprint, sent with each sequence's first response
    model_fingerprint: str | None = None

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


def _pairs(get: GetInput, keys: str, values: str) -> list[tuple[object, float]]:
    """Two inputs read pairwise (keys[i] with values[i]); both or neither."""
    key_array, value_array = get(keys), get(values)
    if key_array is None and value_array is None:
        return []
    if key_array is None or value_array is None:
        missing = keys if key_array is None else values
        raise InvalidInputError(missing, f"{keys} and {values} go together: send both")
    flat_keys, flat_values = key_array.reshape(-1), value_array.reshape(-1)
    if flat_keys.size != flat_values.size:
        raise InvalidInputError(
            values, f"{flat_values.size} values for {flat_keys.size} entries of {keys}: one for each"
        )
    numbers = [float(v) for v in flat_values.tolist()]
    if not all(math.isfinite(v) for v in numbers):
        raise InvalidInputError(values, "must be finite numbers")
    return list(zip(flat_keys.tolist(), numbers))


def _logit_bias(get: GetInput) -> dict[int, float]:
    bias: dict[int, float] = {}
    for token, value in _pairs(get, "logit_bias_ids", "logit_bias_values"):
        bias[int(token)] = bias.get(int(token), 0.0) + value  # type: ignore[call-overload]
    return bias


def _embedding_bias(get: GetInput) -> tuple[tuple[str, float], ...]:
    """TensorRT-LLM's embedding bias: each entry one word (not a CSV list); empty words are dropped."""
    pairs = _pairs(get, "embedding_bias_words", "embedding_bias_weights")
    words = [(_text("embedding_bias_words", w), weight) for w, weight in pairs]
    return tuple((w, weight) for w, weight in words if w)


def _end_id(get: GetInput) -> int | None:
    end_id = _int(get, "end_id")
    if not _bool(get, "ignore_eos"):
        return end_id
    if end_id is not None and end_id != -1:
        raise InvalidInputError("ignore_eos", f"true means no end id, but end_id is {end_id}")
    return -1


def _optional_text(get: GetInput, name: str) -> str:
    value = _one(get, name)
    return "" if value is None else _text(name, value)


def _token_ids(get: GetInput) -> list[int] | None:
    """``input_ids`` (the prompt as token ids, TensorRT-LLM's tensorrt_llm model's input), or None.
    A ``text_input`` beside it must be empty: one prompt, not two."""
    array = get("input_ids")
    if array is None:
        return None
    text = get("text_input")
    if text is not None and any(_text("text_input", v) for v in text.reshape(-1)):
        raise InvalidInputError("input_ids", "send text_input or input_ids, not both")
    ids = array.reshape(-1)
    if ids.size == 0:
        raise InvalidInputError("input_ids", "must not be empty")
    return [int(t) for t in ids.tolist()]


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
# keys clients written for NVIDIA's model send that it ignores as request parameters: its
# accumulate_tokens is a model-config setting (vLLM's and SGLang's benchmarks send it with every
# generate_stream request); ignored here too, the responses carry each round's new text
IGNORED_PARAMETERS = frozenset({"accumulate_tokens"})


def check_parameters(parameters_json: str) -> None:
    """Refuse request parameters the model does not read. Over HTTP, Triton turns every JSON key that
    is not an input into a parameter: a misspelled ``max_token`` would otherwise be ignored."""
    parameters = json.loads(parameters_json) if parameters_json else {}
    unknown = sorted(
        k for k in parameters if not k.startswith(TRITON_PARAMETER_PREFIX) and k not in IGNORED_PARAMETERS
    )
    if unknown:
        known = ", ".join(spec.name for spec in INPUTS if spec.status != "refused")
        raise InvalidInputError(
            unknown[0], f"unknown input or parameter (known inputs: {known})", reason="unknown_parameter"
        )


def parse_inputs(
    get: GetInput,
    defaults: GenerationDefaults,
    max_prompt_bytes: int | None = None,
    resume_refusal: str | None = None,
    model_fingerprint: str | None = None,
    *,
    require_cache_salt: bool = False,
    tokenizer_sha256: str | None = None,
) -> ParsedRequest:
    """Turn one prompt's tensors into a ``GenerationRequest``; unset fields take the YAML defaults.
    A ``text_input`` over ``max_prompt_bytes`` is refused before anything decodes or tokenises it.
    ``resume_refusal``: why this model cannot resume a stream exactly (``skip_output_tokens`` > 0 is
    then refused with it), None where it can. ``model_fingerprint``: this replica's; a request that
    expects another (``expected_model_fingerprint``) is refused. ``require_cache_salt``: refuse a
    request without a ``cache_salt`` (serving.require_cache_salt). ``tokenizer_sha256``: this model's
    tokenizer (``Tokenizer.sha256``); a request from a client of another (``expected_tokenizer_sha256``)
    is refused."""
    token_ids = _token_ids(get)
    prompt_value = _one(get, "text_input") if token_ids is None else None
    if prompt_value is None and token_ids is None:
        raise InvalidInputError("text_input", "is required (or input_ids: the prompt's token ids)")
    if max_prompt_bytes is not None and isinstance(prompt_value, bytes | np.bytes_):
        size = len(prompt_value)
        if size > max_prompt_bytes:
            raise InvalidInputError(
                "text_input",
                f"{size} bytes is over serving.max_prompt_bytes ({max_prompt_bytes})",
                reason="too_long",
            )
    _check_refused(get)
    _check_fingerprint(get, model_fingerprint)
    _check_tokenizer(get, tokenizer_sha256)
    prompt = "" if prompt_value is None else _text("text_input", prompt_value)
    if not prompt and token_ids is None:
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
        prompt_token_ids=token_ids,
        max_tokens=int(pick(_int(get, "max_tokens"), defaults.max_tokens)),
        num_draft_tokens=_int(get, "num_draft_tokens"),
        temperature=float(pick(_float(get, "temperature"), defaults.temperature)),
        top_k=int(pick(_int(get, "top_k"), defaults.top_k)),
        top_p=float(pick(_float(get, "top_p"), defaults.top_p)),
        seed=_alias(get, "seed", "random_seed"),
        stop=tuple(_words(get, "stop_words")),
        bad_words=tuple(_words(get, "bad_words")),
        # -1: no end id at all (TensorRT-LLM's meaning); the core takes it as is
        end_id=_end_id(get),
        repetition_penalty=float(pick(_float(get, "repetition_penalty"), 1.0)),
        presence_penalty=float(pick(_float(get, "presence_penalty"), 0.0)),
        frequency_penalty=float(pick(_float(get, "frequency_penalty"), 0.0)),
        min_tokens=int(pick(min_tokens, 0)),
        logit_bias=_logit_bias(get),
        prediction=_optional_text(get, "prediction"),
        embedding_bias=_embedding_bias(get),
        return_log_probs=_bool(get, "return_log_probs"),
        top_log_probs=int(pick(_int(get, "top_log_probs"), 0)),
        prompt_log_probs=_bool(get, "return_prompt_log_probs"),
        guide=_guide(get),
        cache_salt=_cache_salt(get, require_cache_salt),
    )
    generation.sampling  # noqa: B018 -- validates the sampling fields (names the field)
    stream = _bool(get, "stream")
    skip = _skip_output_tokens(get, generation, stream, 1 if n is None else n, resume_refusal)
    return ParsedRequest(
        generation=replace(_seeded(generation), skip_output_tokens=skip or 0),
        stream=stream,
        exclude_input_in_output=_bool(get, "exclude_input_in_output"),
        resumed=skip is not None,
        num_return_sequences=1 if n is None else n,
        return_perf_metrics=_bool(get, "return_perf_metrics"),
        return_num_input_tokens=_bool(get, "return_num_input_tokens"),
        return_num_output_tokens=_bool(get, "return_num_output_tokens"),
        model_fingerprint=model_fingerprint,
    )


# the guide types of NVIDIA's model (tensorrt_llm/1/model.py get_guided_decoding_params_from_request),
# and structural_tag (TensorRT-LLM's GuideType STRUCTURAL_TAG, which that model does not map)
TENSOR_GUIDE_TYPES = GUIDE_TYPES[:5]


def _guide(get: GetInput) -> Guide | None:
    """NVIDIA's two guided-decoding tensors: the type, and the schema, regex or grammar it reads (none
    for ``json``). An empty type asks for nothing, as an empty string elsewhere."""
    kind_value, text_value = _one(get, "guided_decoding_guide_type"), _one(get, "guided_decoding_guide")
    kind = "" if kind_value is None else _text("guided_decoding_guide_type", kind_value).strip()
    text = "" if text_value is None else _text("guided_decoding_guide", text_value)
    if not kind:
        if text:
            raise InvalidInputError(
                "guided_decoding_guide_type",
                f"is required with guided_decoding_guide: one of {TENSOR_GUIDE_TYPES}",
            )
        return None
    if kind not in TENSOR_GUIDE_TYPES:
        raise InvalidInputError(
            "guided_decoding_guide_type", f"must be one of {', '.join(TENSOR_GUIDE_TYPES)}, got {kind!r}"
        )
    return Guide(kind, text)


def _check_fingerprint(get: GetInput, model_fingerprint: str | None) -> None:
    """A resumed stream expects the model it began on: on a replica serving another (a rolling
    upgrade, another config), going on would splice two models' text."""
    value = _one(get, "expected_model_fingerprint")
    if value is None:
        return
    expected = _text("expected_model_fingerprint", value)
    if expected and expected != model_fingerprint:
        raise InvalidInputError(
            "expected_model_fingerprint",
            f"this replica serves model fingerprint {model_fingerprint or 'unknown'}, not {expected} "
            "(the one the stream began on): a stream resumed here would splice two models' text",
            reason="other_model",
        )


def _check_tokenizer(get: GetInput, tokenizer_sha256: str | None) -> None:
    """A client that renders chat prompts or counts tokens with its own copy of the tokenizer (the
    OpenAI endpoint) names it: one started for another model would send prompts in that model's chat
    format, which this model would answer without any error, only worse."""
    value = _one(get, "expected_tokenizer_sha256")
    if value is None:
        return
    expected = _text("expected_tokenizer_sha256", value).strip().lower()
    if expected and tokenizer_sha256 is not None and expected != tokenizer_sha256:
        raise InvalidInputError(
            "expected_tokenizer_sha256",
            f"this model's tokenizer is {tokenizer_sha256[:16]}..., the client's {expected[:16]}...: "
            "the client formats prompts and counts tokens for another model (start specdec-openai with "
            "--config set to the YAML this server runs)",
            reason="other_tokenizer",
        )


def _cache_salt(get: GetInput, required: bool) -> str | None:
    """The request's cache salt; an empty string is none (clients send "" for unset strings)."""
    value = _one(get, "cache_salt")
    salt = None if value is None else _text("cache_salt", value) or None
    if salt is None and required:
        raise InvalidInputError(
            "cache_salt",
            "is required by this server (serving.require_cache_salt): send your tenant's salt, a secret "
            "string shared only by requests that may share KV-cache blocks",
        )
    return salt


def _seeded(generation: GenerationRequest) -> GenerationRequest:
    """Every sampled request gets a seed, returned in its first response (sampling_seed), so that a
    stream cut by the server can be resumed exactly (trispec_client.resume)."""
    if generation.sampling.greedy or generation.seed is not None:
        return generation
    return replace(generation, seed=secrets.randbits(63))


def _skip_output_tokens(
    get: GetInput, generation: GenerationRequest, stream: bool, n: int, resume_refusal: str | None
) -> int | None:
    """``skip_output_tokens`` as sent (None: not sent), refused where the skipped text could differ
    from what the client was sent before: an unseeded sampled request draws anew every time, and
    some models do not promise batch-invariant outputs (``resume_refusal``)."""
    skip = _int(get, "skip_output_tokens")
    if not skip:
        return skip
    if skip < 0:
        raise InvalidInputError("skip_output_tokens", f"must be >= 0, got {skip}")
    if resume_refusal is not None:
        raise InvalidInputError("skip_output_tokens", f"not supported: {resume_refusal}")
    if not generation.sampling.greedy and generation.seed is None:
        raise InvalidInputError(
            "skip_output_tokens",
            "an unseeded sampled request cannot be resumed: it would draw different tokens; send the "
            "seed its first response returned (sampling_seed)",
        )
    if not stream:
        raise InvalidInputError("skip_output_tokens", "needs stream=true (it skips streamed text)")
    if n > 1:
        raise InvalidInputError("skip_output_tokens", "needs num_return_sequences 1 (it resumes one stream)")
    return skip


def parse_batch(
    get: GetInput,
    defaults: GenerationDefaults,
    max_prompt_bytes: int | None = None,
    resume_refusal: str | None = None,
    model_fingerprint: str | None = None,
    *,
    require_cache_salt: bool = False,
    tokenizer_sha256: str | None = None,
) -> list[ParsedRequest]:
    """A request's rows (Triton's batch dimension: NVIDIA's client sends several prompts as one
    request with ``--batch-inputs``), each parsed on its own; the list index is the ``batch_index``."""
    prompts = get("input_ids")
    if prompts is None:
        prompts = get("text_input")
    if prompts is None:
        raise InvalidInputError("text_input", "is required (or input_ids: the prompt's token ids)")
    rows = prompts.shape[0] if prompts.ndim > 1 else 1

    def row_of(row: int) -> GetInput:
        def get_row(name: str) -> np.ndarray | None:
            array = get(name)
            # Triton checks every batched input has the same batch size
            return array if array is None or rows == 1 else array[row : row + 1]

        return get_row

    return [
        parse_inputs(
            row_of(row),
            defaults,
            max_prompt_bytes,
            resume_refusal,
            model_fingerprint,
            require_cache_salt=require_cache_salt,
            tokenizer_sha256=tokenizer_sha256,
        )
        for row in range(rows)
    ]


_ONE_RESPONSE = "needs serving.decoupled: true (this model sends exactly one response per request)"


def check_one_response(rows: list[ParsedRequest]) -> None:
    """For a model that is not decoupled: refuse what would need more than one response."""
    if any(row.stream for row in rows):
        raise InvalidInputError("stream", f"streaming {_ONE_RESPONSE}")
    if len(rows) > 1:
        raise InvalidInputError("text_input", f"a batch of {len(rows)} prompts {_ONE_RESPONSE}")
    if rows[0].num_return_sequences > 1:
        raise InvalidInputError("num_return_sequences", f"more than one sequence {_ONE_RESPONSE}")
