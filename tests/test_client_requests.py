"""trispec_client without Triton: what a request sends (only the inputs the caller set, Triton's names,
dtypes and shapes, the generate_stream JSON body; values that cannot be carried refused naming the
field) and how responses become chunks.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from client_stand_ins import FINAL_EVENT, STATS, _infer_result
from trispec_client import (
    Completion,
    GenerationRequest,
    InvalidRequestError,
    StreamChunk,
    grpc_transport,
)
from trispec_client.results import chunk_from_outputs, collect


def test_only_the_inputs_the_caller_set_are_sent() -> None:
    assert GenerationRequest("hi").sent_values() == {"text_input": "hi", "stream": True}
    values = GenerationRequest("hi", max_tokens=5, top_p=0.9, stream=False).sent_values()
    assert values == {"text_input": "hi", "max_tokens": 5, "top_p": 0.9, "stream": False}


def test_grpc_tensors_have_the_model_names_dtypes_and_batch_dimension() -> None:
    request = GenerationRequest(
        "héllo",
        max_tokens=7,
        num_draft_tokens=0,
        temperature=0.5,
        top_k=40,
        top_p=0.9,
        seed=2**64 - 1,
        end_id=2,
        stop_words=["\n\n", "END"],
        bad_words=["x"],
        exclude_input_in_output=True,
        logit_bias={5: -100, 9: 2.5},
    )
    tensors = {t.name: t for t in request.tensors()}
    expected = {
        "text_input": ("BYTES", np.object_, (1, 1)),
        "max_tokens": ("INT32", np.int32, (1, 1)),
        "num_draft_tokens": ("INT32", np.int32, (1, 1)),
        "temperature": ("FP32", np.float32, (1, 1)),
        "top_k": ("INT32", np.int32, (1, 1)),
        "top_p": ("FP32", np.float32, (1, 1)),
        "seed": ("UINT64", np.uint64, (1, 1)),
        "end_id": ("INT32", np.int32, (1, 1)),
        "stop_words": ("BYTES", np.object_, (1, 2)),
        "bad_words": ("BYTES", np.object_, (1, 1)),
        "stream": ("BOOL", np.bool_, (1, 1)),
        "exclude_input_in_output": ("BOOL", np.bool_, (1, 1)),
        "logit_bias_ids": ("INT32", np.int32, (1, 2)),
        "logit_bias_values": ("FP32", np.float32, (1, 2)),
    }
    assert set(tensors) == set(expected)
    for name, (datatype, dtype, shape) in expected.items():
        assert tensors[name].datatype == datatype, name
        assert tensors[name].array.dtype == dtype, name
        assert tensors[name].array.shape == shape, name
    assert tensors["text_input"].array[0, 0] == "héllo".encode()
    assert tensors["stop_words"].array.tolist() == [[b"\n\n", b"END"]]
    assert int(tensors["seed"].array[0, 0]) == 2**64 - 1
    assert tensors["max_tokens"].array[0, 0] == 7
    assert tensors["logit_bias_ids"].array.tolist() == [[5, 9]]
    assert tensors["logit_bias_values"].array.tolist() == [[-100.0, 2.5]]


def test_grpc_infer_inputs_carry_name_datatype_shape() -> None:
    inputs = grpc_transport.infer_inputs(GenerationRequest("hi", max_tokens=3, stop_words=["a", "b", "c"]))
    described = [(i.name(), i.datatype(), i.shape()) for i in inputs]
    assert described == [
        ("text_input", "BYTES", [1, 1]),
        ("max_tokens", "INT32", [1, 1]),
        ("stream", "BOOL", [1, 1]),
        ("stop_words", "BYTES", [1, 3]),
    ]


def test_json_body_for_generate_stream() -> None:
    request = GenerationRequest(
        "hi",
        max_tokens=np.int64(4),
        temperature=0.0,
        seed=7,
        stop_words=("x", "y"),
        stream=False,
        logit_bias={3: 1.5},
    )
    body = request.json_body()
    assert body == {
        "text_input": "hi",
        "max_tokens": 4,
        "temperature": 0.0,
        "seed": 7,
        "stream": False,
        "stop_words": ["x", "y"],
        "logit_bias_ids": [3],
        "logit_bias_values": [1.5],
    }
    assert json.loads(json.dumps(body)) == body  # numpy scalars were turned into plain ones


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"top_k": "4"}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": math.inf}, "top_p"),
        ({"top_p": "0.5"}, "top_p"),
        ({"stop_words": [""]}, "stop_words"),
        ({"bad_words": [3]}, "bad_words"),
        ({"stream": 1}, "stream"),
        ({"logit_bias": {2**31: 1.0}}, "logit_bias"),
        ({"logit_bias": {"3": 1.0}}, "logit_bias"),
        ({"logit_bias": {3: math.nan}}, "logit_bias"),
        ({"logit_bias": [(3, 1.0)]}, "logit_bias"),
    ],
)
def test_values_that_cannot_be_carried_fail_naming_the_field(fields: dict[str, Any], field_name: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        GenerationRequest("hi", **fields)
    assert info.value.message.startswith(f"{field_name}:")
    assert info.value.status == "INVALID_ARGUMENT"


def test_a_prompt_of_token_ids_is_sent_as_input_ids() -> None:
    request = GenerationRequest("", prompt_token_ids=[5, 6, 7], max_tokens=2)
    tensors = {t.name: t for t in request.tensors()}
    assert "text_input" not in tensors and tensors["input_ids"].datatype == "INT32"
    assert tensors["input_ids"].array.tolist() == [[5, 6, 7]] and request.routing_key == "5 6 7"
    assert request.json_body()["input_ids"] == [5, 6, 7]
    bads = ({"prompt_token_ids": []}, {"prompt_token_ids": [-1]}, {"prompt_token_ids": [1], "prompt": "x"})
    for bad in bads:
        with pytest.raises(InvalidRequestError, match="input_ids"):
            GenerationRequest(**{"prompt": "", **bad})  # type: ignore[arg-type]


def test_a_bare_stop_string_is_one_word_not_characters() -> None:
    assert GenerationRequest("hi", stop_words="END").stop_words == ("END",)  # type: ignore[arg-type]


def test_prompt_must_be_text() -> None:
    with pytest.raises(InvalidRequestError, match="text_input"):
        GenerationRequest(b"bytes")  # type: ignore[arg-type]


def test_chunk_from_grpc_arrays() -> None:
    outputs = {
        "text_output": np.array([[b" world"]], dtype=np.object_),
        "output_token_count": np.array([[2]], dtype=np.int32),
    }
    chunk = chunk_from_outputs(outputs, final=False)
    assert chunk == StreamChunk(text=" world", token_count=2)
    assert type(chunk.token_count) is int


def test_final_chunk_carries_reason_and_stats() -> None:
    outputs = {k: np.array([[v.encode() if isinstance(v, str) else v]]) for k, v in FINAL_EVENT.items()}
    chunk = chunk_from_outputs(outputs, final=True)
    assert chunk.final and chunk.finish_reason == "length" and chunk.token_count == 3
    assert chunk.stats == STATS


def test_empty_final_response_keeps_the_count() -> None:
    chunk = chunk_from_outputs({}, final=True, previous_token_count=9)
    assert chunk == StreamChunk(text="", token_count=9, final=True)


def test_collect_joins_text_and_takes_the_final_totals() -> None:
    chunks = [
        StreamChunk("Hel", 1),
        StreamChunk("lo", 2),
        StreamChunk("", 2, final=True, finish_reason="stop", stats=STATS),
    ]
    assert collect(chunks) == Completion("Hello", 2, "stop", STATS)


def test_grpc_response_outputs_and_final_flag() -> None:
    outputs, final = grpc_transport.response_outputs(
        _infer_result({"text_output": "hi", "output_token_count": 1}, final=False)
    )
    assert not final
    assert chunk_from_outputs(outputs, final=final) == StreamChunk("hi", 1)
    _, final = grpc_transport.response_outputs(_infer_result({}, final=True))
    assert final
    _, final = grpc_transport.response_outputs(_infer_result({"text_output": "x"}, final=None))
    assert not final  # no parameter: not final
