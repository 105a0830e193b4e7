"""The tensor interface's request parameters and resuming inputs: unknown parameters and oversized
text refused naming the key, a sampled request without a seed given one, skip_output_tokens
accepted only where the text can be resumed exactly, a resume expecting another model refused, and
exact resumption refused on TensorRT-LLM and CUDA.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from bls_tensors import DEFAULTS, parse, tensors
from trispec.errors import InvalidInputError
from trispec.serving.tensors import (
    check_parameters,
    parse_inputs,
)


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ('{"max_token": 4}', "max_token"),
        ('{"triton_enable_empty_final_response": true, "tempreature": 0.1}', "tempreature"),
        ('{"triton_enable_empty_final_response": true}', None),
        # NVIDIA's model ignores it as a request parameter (a model-config setting there): so do we
        ('{"accumulate_tokens": true}', None),
        ("{}", None),
        ("", None),
    ],
)
def test_unknown_request_parameters_are_refused_naming_the_key(parameters: str, refused: str | None) -> None:
    if refused is None:
        check_parameters(parameters)
        return
    with pytest.raises(InvalidInputError) as error:
        check_parameters(parameters)
    assert error.value.field == refused and error.value.reason == "unknown_parameter"
    assert "max_tokens" in error.value.message  # says which inputs exist


def test_oversized_text_input_is_refused_before_decoding() -> None:
    given = tensors(text_input="x" * 101)
    with pytest.raises(InvalidInputError, match=r"serving\.max_prompt_bytes") as error:
        parse_inputs(given.get, DEFAULTS, max_prompt_bytes=100)
    assert error.value.field == "text_input" and error.value.reason == "too_long"
    assert parse_inputs(tensors(text_input="x" * 100).get, DEFAULTS, max_prompt_bytes=100)
    # invalid UTF-8 past the limit: refused on size, never decoded
    with pytest.raises(InvalidInputError, match="max_prompt_bytes"):
        parse_inputs({"text_input": np.array([[b"\xff" * 200]], dtype=object)}.get, DEFAULTS, 100)


def test_a_sampled_request_without_a_seed_gets_one_and_a_greedy_one_none() -> None:
    """So that it can be resumed exactly: the seed is returned in its first response (sampling_seed)."""
    first, second = (parse(text_input="x", temperature=np.array([[0.8]], dtype=np.float32)) for _ in "ab")
    assert isinstance(first.generation.seed, int) and 0 <= first.generation.seed < 2**63
    assert first.generation.seed != second.generation.seed
    assert first.generation.sampling.seeded
    assert parse(text_input="x").generation.seed is None  # greedy: nothing to seed
    given = parse(text_input="x", temperature=np.array([[0.8]], dtype=np.float32), seed=np.array([[9]]))
    assert given.generation.seed == 9


def test_skip_output_tokens_resumes_only_what_can_be_resumed_exactly() -> None:
    sampled = {"temperature": np.array([[0.8]], dtype=np.float32), "stream": np.array([[True]])}
    skip = {"skip_output_tokens": np.array([[5]], dtype=np.int32)}
    resumed = parse(text_input="x", seed=np.array([[3]], dtype=np.uint64), **sampled, **skip)
    assert resumed.generation.skip_output_tokens == 5 and resumed.resumed and resumed.generation.seed == 3
    greedy = parse(text_input="x", stream=np.array([[True]]), **skip)
    assert greedy.generation.skip_output_tokens == 5 and greedy.resumed
    plain = parse(text_input="x")
    assert plain.generation.skip_output_tokens == 0 and not plain.resumed
    # 0 skips nothing: a stream cut before its first token, sent again (counted as resumed)
    nothing = parse(text_input="x", skip_output_tokens=np.array([[0]], dtype=np.int32), **sampled)
    assert (
        nothing.resumed and nothing.generation.skip_output_tokens == 0 and nothing.generation.seed is not None
    )
    refused = [
        ({**sampled, **skip}, "unseeded sampled request cannot be resumed"),
        ({**skip}, "needs stream=true"),
        (
            {**skip, "stream": np.array([[True]]), "num_return_sequences": np.array([[2]])},
            "num_return_sequences 1",
        ),
        ({"skip_output_tokens": np.array([[-1]], dtype=np.int32)}, "must be >= 0"),
    ]
    for values, why in refused:
        with pytest.raises(InvalidInputError, match=why) as error:
            parse(text_input="x", **values)
        assert error.value.field == "skip_output_tokens"
    # where the model cannot promise the same tokens again, any skip is refused, saying why
    given = tensors(text_input="x", stream=np.array([[True]]), **skip)
    with pytest.raises(InvalidInputError, match="not supported: the GPU path") as error:
        parse_inputs(given.get, DEFAULTS, resume_refusal="the GPU path is not batch-invariant")
    assert error.value.field == "skip_output_tokens"


def test_a_resume_expecting_another_model_is_refused() -> None:
    """A stream that began on a replica serving another model (another fingerprint) does not go on
    here: its text would be spliced from two models."""
    mine = "0123456789abcdef"
    same = tensors(text_input="x", expected_model_fingerprint=np.array([[mine.encode()]], dtype=object))
    parsed = parse_inputs(same.get, DEFAULTS, model_fingerprint=mine)
    assert parsed.model_fingerprint == mine  # reported in each sequence's first response
    other = tensors(
        text_input="x", expected_model_fingerprint=np.array([[b"fedcba9876543210"]], dtype=object)
    )
    with pytest.raises(
        InvalidInputError, match=f"serves model fingerprint {mine}, not fedcba9876543210"
    ) as error:
        parse_inputs(other.get, DEFAULTS, model_fingerprint=mine)
    assert error.value.field == "expected_model_fingerprint" and error.value.reason == "other_model"
    assert (
        parse_inputs(tensors(text_input="x").get, DEFAULTS, model_fingerprint=mine).model_fingerprint == mine
    )


def test_exact_resumption_is_refused_on_trtllm_and_on_cuda() -> None:
    from trispec.config import EngineConfig, load_config
    from trispec.serving.triton_model import exact_resume_refusal

    config = load_config(None)
    assert exact_resume_refusal(config) is None
    trtllm = config.model_copy(update={"engine": EngineConfig(kind="trtllm")})
    assert "engine.kind trtllm" in exact_resume_refusal(trtllm)
    cuda = config.model_copy(update={"target": config.target.model_copy(update={"device": "cuda:1"})})
    assert "target.device is cuda:1" in exact_resume_refusal(cuda)


def test_a_client_of_another_tokenizer_is_refused() -> None:
    """A client that formats prompts with its own copy of the tokenizer (specdec-openai) names it; one
    started for another model is refused rather than answered. Empty or absent: no check."""
    mine = "ab" * 32

    def given(expected: str | None) -> dict[str, np.ndarray]:
        extra = {} if expected is None else {"expected_tokenizer_sha256": expected}
        return tensors(text_input="x", **extra)

    for expected in (None, "", mine, mine.upper()):
        assert parse_inputs(given(expected).get, DEFAULTS, tokenizer_sha256=mine).generation.prompt == "x"
    refusal = re.escape("tokenizer is abababababababab..., the client's cdcdcdcdcdcdcdcd...")
    with pytest.raises(InvalidInputError, match=refusal) as error:
        parse_inputs(given("cd" * 32).get, DEFAULTS, tokenizer_sha256=mine)
    assert error.value.field == "expected_tokenizer_sha256" and error.value.reason == "other_tokenizer"
    assert "--config" in error.value.message
