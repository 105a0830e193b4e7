"""The BLS-compatible tensor interface: parsing, defaults, and bad input naming the tensor."""

from __future__ import annotations

import numpy as np
import pytest
from trispec.config import GenerationDefaults
from trispec.errors import InvalidInputError
from trispec.serving.tensors import (
    IGNORED_INPUTS,
    INPUTS,
    OUTPUTS,
    as_tensor_error,
    check_parameters,
    parse_inputs,
    response_tensors,
)
from trispec.stats import AcceptanceStats

DEFAULTS = GenerationDefaults(max_tokens=32, temperature=0.0)


def tensors(**values: object) -> dict[str, np.ndarray]:
    """Client-style tensors: every value in a [1, 1] array (strings as bytes, lists as [1, n])."""
    out = {}
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            out[name] = value
        elif isinstance(value, list):
            out[name] = np.array([[v.encode() if isinstance(v, str) else v for v in value]], dtype=object)
        elif isinstance(value, str):
            out[name] = np.array([[value.encode()]], dtype=object)
        else:
            out[name] = np.array([[value]])
    return out


def parse(**values: object):
    given = tensors(**values)
    return parse_inputs(given.get, DEFAULTS)


def test_defaults_come_from_the_yaml_section() -> None:
    parsed = parse(text_input="Hello")
    g = parsed.generation
    assert (g.prompt, g.max_tokens, g.temperature, g.top_k, g.top_p) == ("Hello", 32, 0.0, 0, 1.0)
    assert g.num_draft_tokens is None and g.seed is None and g.end_id is None and tuple(g.stop) == ()
    assert parsed.stream is False and parsed.exclude_input_in_output is False


def test_every_field_is_read() -> None:
    parsed = parse(
        text_input="Hi",
        max_tokens=np.array([[7]], dtype=np.int32),
        num_draft_tokens=np.array([[3]], dtype=np.int32),
        temperature=np.array([[0.7]], dtype=np.float32),
        top_k=np.array([[5]], dtype=np.int32),
        top_p=np.array([[0.9]], dtype=np.float32),
        random_seed=np.array([[2**63 + 5]], dtype=np.uint64),
        end_id=np.array([[2]], dtype=np.int32),
        stop_words=["a,b", "", "c"],
        bad_words=[""],
        stream=np.array([[True]]),
        exclude_input_in_output=np.array([[True]]),
        repetition_penalty=np.array([[1.3]], dtype=np.float32),
    )
    g = parsed.generation
    assert (g.max_tokens, g.num_draft_tokens, g.top_k, g.end_id) == (7, 3, 5, 2)
    assert g.temperature == pytest.approx(0.7) and g.top_p == pytest.approx(0.9)
    assert g.seed == 2**63 + 5
    assert list(g.stop) == ["a", "b", "c"]  # CSV inside each string, as the BLS model reads them
    assert parsed.stream and parsed.exclude_input_in_output


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({}, "text_input"),
        ({"text_input": ""}, "text_input"),
        ({"text_input": np.array([[b"\xff\xfe"]], dtype=object)}, "text_input"),
        ({"text_input": ["a", "b"]}, "text_input"),
        ({"text_input": "x", "temperature": np.array([[-1.0]], dtype=np.float32)}, "temperature"),
        ({"text_input": "x", "temperature": np.array([[np.nan]], dtype=np.float32)}, "temperature"),
        ({"text_input": "x", "top_p": np.array([[1.5]], dtype=np.float32)}, "top_p"),
        ({"text_input": "x", "top_k": np.array([[-2]], dtype=np.int32)}, "top_k"),
        ({"text_input": "x", "seed": np.array([[1]]), "random_seed": np.array([[2]])}, "seed"),
        ({"text_input": "x", "beam_width": np.array([[4]], dtype=np.int32)}, "beam_width"),
        ({"text_input": "x", "max_tokens": np.array([[1, 2]], dtype=np.int32)}, "max_tokens"),
        ({"text_input": "x", "stop_words": np.array([[b"\xc3"]], dtype=object)}, "stop_words"),
    ],
)
def test_bad_input_names_the_tensor(values: dict, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse(**values)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")


def test_table_has_each_name_once_and_documents_ignored_inputs() -> None:
    names = [s.name for s in INPUTS]
    assert len(names) == len(set(names))
    assert [s.name for s in INPUTS if not s.optional] == ["text_input"]
    assert "bad_words" in IGNORED_INPUTS and "text_input" not in IGNORED_INPUTS
    assert len({s.name for s in OUTPUTS}) == len(OUTPUTS)


def test_response_tensors_follow_the_output_table() -> None:
    stats = AcceptanceStats()
    stats.record_round(4, 3)
    stats.record_round(2, 1)
    stats.record_round(0, 0, 3)  # planned 3, the drafter found nothing
    plain = response_tensors("héllo", 5)
    final = response_tensors("", 9, "length", stats)
    declared = {s.name for s in OUTPUTS}
    assert set(plain) == {"text_output", "output_token_count"}
    assert set(final) == declared
    assert plain["text_output"].shape == (1, 1) and plain["text_output"][0, 0] == "héllo".encode()
    assert final["draft_tokens"][0, 0] == 6 and final["accepted_tokens"][0, 0] == 4
    assert final["verify_rounds"][0, 0] == 3
    assert final["acceptance_rate"][0, 0] == pytest.approx(4 / 6)
    assert final["mean_accepted_length"][0, 0] == pytest.approx(1 + 4 / 3)
    assert final["mean_num_draft_tokens"][0, 0] == pytest.approx(3.0)
    assert final["finish_reason"][0, 0] == b"length"


def test_core_errors_are_reported_under_the_tensor_name() -> None:
    assert str(as_tensor_error(InvalidInputError("prompt", "too long"))) == "text_input: too long"
    assert as_tensor_error(InvalidInputError("stop", "x")).field == "stop_words"
    assert as_tensor_error(InvalidInputError("top_p", "x")).field == "top_p"


def test_readme_lists_exactly_the_ignored_inputs() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    paragraph = readme.split("Accepted and **ignored**", 1)[1].split("No log-prob", 1)[0]
    listed = {part.strip("` \n,.") for part in paragraph.split("`")[1::2]}
    assert listed == set(IGNORED_INPUTS)


@pytest.mark.parametrize(
    ("parameters", "refused"),
    [
        ('{"max_token": 4}', "max_token"),
        ('{"triton_enable_empty_final_response": true, "tempreature": 0.1}', "tempreature"),
        ('{"triton_enable_empty_final_response": true}', None),
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
