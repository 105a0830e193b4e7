"""The BLS-compatible tensor interface: parsing, defaults, and bad input naming the tensor."""

from __future__ import annotations

import numpy as np
import pytest
from trispec.config import GenerationDefaults
from trispec.errors import InvalidInputError
from trispec.serving.tensors import (
    INPUTS,
    OUTPUTS,
    REFUSED_INPUTS,
    PerfMetrics,
    as_tensor_error,
    check_one_response,
    check_parameters,
    parse_batch,
    parse_inputs,
    response_tensors,
)
from trispec.stats import AcceptanceStats
from trispec.step import KVCacheMetrics

# NVIDIA's tensorrt_llm_bls model (TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
# tensorrt_llm_bls/config.pbtxt, 2025): every input and output, with its data type and dims
BLS_INPUTS = {
    "text_input": ("TYPE_STRING", (1,)),
    "decoder_text_input": ("TYPE_STRING", (1,)),
    "image_input": ("TYPE_FP16", (-1, 3, -1, -1)),
    "image_bytes_input": ("TYPE_UINT8", (-1, -1, -1, -1)),
    "image_url_input": ("TYPE_STRING", (1,)),
    "video_bytes_input": ("TYPE_UINT8", (-1, -1, -1, -1)),
    "max_tokens": ("TYPE_INT32", (1,)),
    "bad_words": ("TYPE_STRING", (-1,)),
    "stop_words": ("TYPE_STRING", (-1,)),
    "exclude_input_in_output": ("TYPE_BOOL", (1,)),
    "end_id": ("TYPE_INT32", (1,)),
    "pad_id": ("TYPE_INT32", (1,)),
    "top_k": ("TYPE_INT32", (1,)),
    "top_p": ("TYPE_FP32", (1,)),
    "temperature": ("TYPE_FP32", (1,)),
    "length_penalty": ("TYPE_FP32", (1,)),
    "repetition_penalty": ("TYPE_FP32", (1,)),
    "min_tokens": ("TYPE_INT32", (1,)),
    "presence_penalty": ("TYPE_FP32", (1,)),
    "frequency_penalty": ("TYPE_FP32", (1,)),
    "seed": ("TYPE_UINT64", (1,)),
    "return_log_probs": ("TYPE_BOOL", (1,)),
    "return_context_logits": ("TYPE_BOOL", (1,)),
    "return_generation_logits": ("TYPE_BOOL", (1,)),
    "num_return_sequences": ("TYPE_INT32", (1,)),
    "beam_width": ("TYPE_INT32", (1,)),
    "stream": ("TYPE_BOOL", (1,)),
    "prompt_embedding_table": ("TYPE_FP16", (-1, -1)),
    "prompt_vocab_size": ("TYPE_INT32", (1,)),
    "prompt_table_extra_id": ("TYPE_UINT64", (1,)),
    "embedding_bias_words": ("TYPE_STRING", (-1,)),
    "embedding_bias_weights": ("TYPE_FP32", (-1,)),
    "num_draft_tokens": ("TYPE_INT32", (1,)),
    "use_draft_logits": ("TYPE_BOOL", (1,)),
    "lora_task_id": ("TYPE_UINT64", (1,)),
    "lora_weights": ("TYPE_FP16", (-1, -1)),
    "lora_config": ("TYPE_INT32", (-1, 3)),
    "return_perf_metrics": ("TYPE_BOOL", (1,)),
    "return_num_input_tokens": ("TYPE_BOOL", (1,)),
    "return_num_output_tokens": ("TYPE_BOOL", (1,)),
    "guided_decoding_guide_type": ("TYPE_STRING", (1,)),
    "guided_decoding_guide": ("TYPE_STRING", (1,)),
}
# logits take ${logits_datatype} there: TYPE_FP32 is its usual value
BLS_OUTPUTS = {
    "text_output": ("TYPE_STRING", (-1,)),
    "cum_log_probs": ("TYPE_FP32", (-1,)),
    "output_log_probs": ("TYPE_FP32", (-1, -1)),
    "context_logits": ("TYPE_FP32", (-1, -1)),
    "generation_logits": ("TYPE_FP32", (-1, -1, -1)),
    "batch_index": ("TYPE_INT32", (1,)),
    "sequence_index": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_reused_blocks": ("TYPE_INT32", (1,)),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", (1,)),
    "arrival_time_ns": ("TYPE_INT64", (1,)),
    "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
    "first_token_time_ns": ("TYPE_INT64", (1,)),
    "last_token_time_ns": ("TYPE_INT64", (1,)),
    "acceptance_rate": ("TYPE_FP32", (1,)),
    "total_accepted_draft_tokens": ("TYPE_INT32", (1,)),
    "total_draft_tokens": ("TYPE_INT32", (1,)),
    "num_input_tokens": ("TYPE_INT32", (1,)),
    "num_output_tokens": ("TYPE_INT32", (1,)),
}

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
    assert (g.repetition_penalty, g.presence_penalty, g.frequency_penalty, g.min_tokens) == (1.0, 0.0, 0.0, 0)
    assert tuple(g.bad_words) == () and not g.return_log_probs
    assert parsed.stream is False and parsed.exclude_input_in_output is False
    assert parsed.num_return_sequences == 1 and not parsed.return_perf_metrics


def test_every_field_is_read() -> None:
    parsed = parse(
        text_input="Hi",
        max_tokens=np.array([[7]], dtype=np.int32),
        num_draft_tokens=np.array([[3]], dtype=np.int32),
        temperature=np.array([[0.7]], dtype=np.float32),
        top_k=np.array([[5]], dtype=np.int32),
        top_p=np.array([[0.9]], dtype=np.float32),
        random_seed=np.array([[2**63 + 5]], dtype=np.uint64),
        end_id=np.array([[-1]], dtype=np.int32),
        stop_words=["a,b", "", "c"],
        bad_words=["x", ""],
        stream=np.array([[True]]),
        exclude_input_in_output=np.array([[True]]),
        repetition_penalty=np.array([[1.3]], dtype=np.float32),
        presence_penalty=np.array([[0.5]], dtype=np.float32),
        frequency_penalty=np.array([[0.25]], dtype=np.float32),
        min_length=np.array([[4]], dtype=np.int32),
        return_log_probs=np.array([[True]]),
        num_return_sequences=np.array([[3]], dtype=np.int32),
        return_perf_metrics=np.array([[True]]),
        return_num_input_tokens=np.array([[True]]),
        return_num_output_tokens=np.array([[True]]),
        # accepted, changing nothing here (see the tensor table in docs/serving.md)
        pad_id=np.array([[2]], dtype=np.int32),
        length_penalty=np.array([[1.2]], dtype=np.float32),
        use_draft_logits=np.array([[True]]),
        beam_width=np.array([[1]], dtype=np.int32),
        # a false flag or an empty string asks for nothing we refuse
        return_context_logits=np.array([[False]]),
        return_generation_logits=np.array([[False]]),
        decoder_text_input="",
        cache_salt="tenant-7",
    )
    g = parsed.generation
    assert (g.max_tokens, g.num_draft_tokens, g.top_k, g.end_id, g.min_tokens) == (7, 3, 5, -1, 4)
    assert g.cache_salt == "tenant-7"
    assert g.temperature == pytest.approx(0.7) and g.top_p == pytest.approx(0.9)
    assert g.repetition_penalty == pytest.approx(1.3)
    assert (g.presence_penalty, g.frequency_penalty) == (0.5, 0.25)
    assert g.seed == 2**63 + 5
    assert list(g.stop) == ["a", "b", "c"]  # CSV inside each string, as the BLS model reads them
    assert list(g.bad_words) == ["x"] and g.return_log_probs
    assert parsed.stream and parsed.exclude_input_in_output
    assert parsed.num_return_sequences == 3
    assert parsed.return_perf_metrics and parsed.return_num_input_tokens and parsed.return_num_output_tokens
    # n sequences of one prompt: seeded ones draw with seed + i (wrapping at 2**64)
    seeds = [
        s.seed
        for s in parse(
            text_input="x",
            seed=np.array([[2**64 - 2]], dtype=np.uint64),
            num_return_sequences=np.array([[3]], dtype=np.int32),
        ).sequences()
    ]
    assert seeds == [2**64 - 2, 2**64 - 1, 0]
    assert [s.seed for s in parse(text_input="x", num_return_sequences=np.array([[2]])).sequences()] == [
        None
    ] * 2


def test_a_batched_request_is_one_request_per_row() -> None:
    given = {
        "text_input": np.array([[b"first"], [b"second"]], dtype=object),
        "max_tokens": np.array([[4], [9]], dtype=np.int32),
        "stop_words": np.array([[b"x", b""], [b"y", b"z"]], dtype=object),
    }
    rows = parse_batch(given.get, DEFAULTS)
    assert [(r.generation.prompt, r.generation.max_tokens, list(r.generation.stop)) for r in rows] == [
        ("first", 4, ["x"]),
        ("second", 9, ["y", "z"]),
    ]
    # an HTTP generate request sends scalars: shape [1]
    assert (
        parse_batch({"text_input": np.array([b"one"], dtype=object)}.get, DEFAULTS)[0].generation.prompt
        == "one"
    )


def test_one_response_models_refuse_what_needs_more() -> None:
    check_one_response([parse(text_input="x")])
    with pytest.raises(InvalidInputError, match=r"^stream: streaming needs serving\.decoupled: true"):
        check_one_response([parse(text_input="x", stream=np.array([[True]]))])
    with pytest.raises(InvalidInputError, match="num_return_sequences"):
        check_one_response([parse(text_input="x", num_return_sequences=np.array([[2]]))])
    with pytest.raises(InvalidInputError, match="a batch of 2 prompts"):
        check_one_response([parse(text_input="x"), parse(text_input="y")])


@pytest.mark.parametrize("spec", REFUSED_INPUTS, ids=lambda spec: spec.name)
def test_inputs_we_cannot_honour_are_refused_saying_why(spec) -> None:
    value = {
        "TYPE_BOOL": np.array([[True]]),
        "TYPE_STRING": np.array([[b"something"]], dtype=object),
    }.get(spec.triton_type, np.ones([1, *(abs(d) for d in spec.dims)]))
    with pytest.raises(InvalidInputError) as info:
        parse(text_input="x", **{spec.name: value})
    assert info.value.field == spec.name
    assert str(info.value) == f"{spec.name}: not supported: {spec.why}"


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
        ({"text_input": "x", "min_tokens": np.array([[1]]), "min_length": np.array([[2]])}, "min_tokens"),
        ({"text_input": "x", "min_tokens": np.array([[-1]])}, "min_tokens"),
        ({"text_input": "x", "num_return_sequences": np.array([[0]])}, "num_return_sequences"),
        ({"text_input": "x", "num_return_sequences": np.array([[17]])}, "num_return_sequences"),
        ({"text_input": "x", "length_penalty": np.array([[np.inf]], dtype=np.float32)}, "length_penalty"),
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


def test_every_bls_tensor_is_declared_as_there() -> None:
    """NVIDIA's clients never meet "unexpected inference input/output": same names, types and dims."""
    names = [s.name for s in INPUTS]
    assert len(names) == len(set(names)) and len({s.name for s in OUTPUTS}) == len(OUTPUTS)
    assert [s.name for s in INPUTS if not s.optional] == ["text_input"]
    inputs = {s.name: (s.triton_type, s.dims) for s in INPUTS}
    outputs = {s.name: (s.triton_type, s.dims) for s in OUTPUTS}
    assert {name: inputs.get(name) for name in BLS_INPUTS} == BLS_INPUTS
    assert {name: outputs.get(name) for name in BLS_OUTPUTS} == BLS_OUTPUTS
    # ours: the older BLS names, and our own outputs
    assert {s.name for s in INPUTS if s.status == "extension"} == set(inputs) - set(BLS_INPUTS)
    assert {s.name for s in OUTPUTS if s.status == "extension"} == set(outputs) - set(BLS_OUTPUTS)
    assert all(s.why for s in (*INPUTS, *OUTPUTS) if s.status == "refused")


def test_response_tensors_follow_the_output_table() -> None:
    stats = AcceptanceStats()
    stats.record_round(4, 3)
    stats.record_round(2, 1)
    stats.record_round(0, 0, 3)  # planned 3, the drafter found nothing
    plain = response_tensors("héllo", 5)
    final = response_tensors(
        "",
        9,
        "length",
        stats,
        batch_index=1,
        sequence_index=2,
        log_probs=[-0.5, -0.25],
        cum_log_prob=-1.5,
        perf=PerfMetrics(10, 20, 30, 40, KVCacheMetrics(5, 3, 1, 3, 40)),
        num_input_tokens=6,
        num_output_tokens=2,
        seed=2**63 + 1,
        skipped_text_sha256="ab" * 32,
        model_fingerprint="0123456789abcdef",
        cached_tokens=40,
    )
    declared = {s.name for s in OUTPUTS}
    never_sent = {s.name for s in OUTPUTS if s.status == "refused"}
    assert set(plain) == {"text_output", "output_token_count", "batch_index", "sequence_index"}
    assert set(final) == declared - never_sent
    # text_output is [1], as the BLS model sends it (NVIDIA's client does output[0].decode())
    assert plain["text_output"].shape == (1,) and plain["text_output"][0] == "héllo".encode()
    assert all(t.shape == (1, 1) for n, t in final.items() if n not in ("text_output", "output_log_probs"))
    assert final["output_log_probs"].shape == (1, 1, 2) and final["output_log_probs"].dtype == np.float32
    assert final["cum_log_probs"][0, 0] == -1.5
    assert (final["batch_index"][0, 0], final["sequence_index"][0, 0]) == (1, 2)
    assert final["arrival_time_ns"].dtype == np.int64 and final["last_token_time_ns"][0, 0] == 40
    # TensorRT-LLM's kv_cache_metrics: 5 blocks reused, 3 missed and taken (1 never used before)
    kv = {
        n: int(final[f"kv_cache_{n}"][0, 0]) for n in ("reused_blocks", "missed_blocks", "alloc_total_blocks")
    }
    assert kv == {"reused_blocks": 5, "missed_blocks": 3, "alloc_total_blocks": 3}
    assert final["kv_cache_alloc_new_blocks"][0, 0] == 1 and final["cached_tokens"][0, 0] == 40
    assert final["kv_cache_hit_rate"].dtype == np.float32 and final["kv_cache_hit_rate"][0, 0] == 5 / 8
    assert (final["num_input_tokens"][0, 0], final["num_output_tokens"][0, 0]) == (6, 2)
    assert final["sampling_seed"].dtype == np.uint64 and final["sampling_seed"][0, 0] == 2**63 + 1
    assert final["skipped_text_sha256"][0, 0] == b"ab" * 32
    assert final["model_fingerprint"][0, 0] == b"0123456789abcdef"
    assert final["draft_tokens"][0, 0] == 6 and final["accepted_tokens"][0, 0] == 4
    assert final["total_draft_tokens"][0, 0] == 6 and final["total_accepted_draft_tokens"][0, 0] == 4
    assert final["verify_rounds"][0, 0] == 3
    assert final["acceptance_rate"][0, 0] == pytest.approx(4 / 6)
    assert final["mean_accepted_length"][0, 0] == pytest.approx(1 + 4 / 3)
    assert final["mean_num_draft_tokens"][0, 0] == pytest.approx(3.0)
    assert final["finish_reason"][0, 0] == b"length"
    # perf metrics on a response that is not the last: acceptance so far, not our final-only totals
    midway = response_tensors("x", 1, None, stats, perf=PerfMetrics(1, 2, 3, 4, None))
    assert "total_draft_tokens" in midway and "finish_reason" not in midway and "draft_tokens" not in midway


def test_core_errors_are_reported_under_the_tensor_name() -> None:
    assert str(as_tensor_error(InvalidInputError("prompt", "too long"))) == "text_input: too long"
    assert as_tensor_error(InvalidInputError("stop", "x")).field == "stop_words"
    assert as_tensor_error(InvalidInputError("top_p", "x")).field == "top_p"


def test_docs_tensor_table_lists_every_tensor_with_its_status() -> None:
    """docs/serving.md's table: every BLS input and output, and ours, each marked as in the tensor table."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    section = doc.split("\n## Tensors", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            for name in cells[0].split("`")[1::2]:
                rows[name] = cells[2]
    expected = {s.name: s.status for s in (*INPUTS, *OUTPUTS)}
    assert rows == expected


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


def test_a_cache_salt_is_read_and_required_where_the_server_says() -> None:
    assert parse(text_input="x").generation.cache_salt is None
    assert parse(text_input="x", cache_salt="").generation.cache_salt is None  # "": not sent
    required = tensors(text_input="x")
    with pytest.raises(InvalidInputError, match="cache_salt: is required by this server"):
        parse_inputs(required.get, DEFAULTS, require_cache_salt=True)
    salted = tensors(text_input="x", cache_salt="a")
    assert parse_inputs(salted.get, DEFAULTS, require_cache_salt=True).generation.cache_salt == "a"
