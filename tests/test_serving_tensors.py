"""The BLS-compatible tensor interface: parsing, defaults, and bad input naming the tensor; every BLS
tensor declared as there, the response tensors following the output table, the docs' table listing
every tensor with its status.
"""

from __future__ import annotations

import numpy as np
import pytest
from bls_tensors import BLS_INPUTS, BLS_OUTPUTS, DEFAULTS, parse, tensors
from trispec.errors import InvalidInputError
from trispec.serving.tensors import (
    INPUTS,
    OUTPUTS,
    REFUSED_INPUTS,
    PerfMetrics,
    as_tensor_error,
    check_one_response,
    parse_batch,
    parse_inputs,
    response_tensors,
)
from trispec.stats import AcceptanceStats
from trispec.step import KVCacheMetrics, PromptLogProbs, TokenAlternatives


def test_defaults_come_from_the_yaml_section() -> None:
    parsed = parse(text_input="Hello")
    g = parsed.generation
    assert (g.prompt, g.max_tokens, g.temperature, g.top_k, g.top_p) == ("Hello", 32, 0.0, 0, 1.0)
    assert g.num_draft_tokens is None and g.seed is None and g.end_id is None and tuple(g.stop) == ()
    assert (g.repetition_penalty, g.presence_penalty, g.frequency_penalty, g.min_tokens) == (1.0, 0.0, 0.0, 0)
    assert tuple(g.bad_words) == () and not g.return_log_probs and g.top_log_probs == 0
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
        top_log_probs=np.array([[4]], dtype=np.int32),
        return_prompt_log_probs=np.array([[True]]),
        prediction="Hi there",
        logit_bias_ids=np.array([[5, 9, 5]], dtype=np.int32),
        logit_bias_values=np.array([[1.5, -100, 0.5]], dtype=np.float32),
        embedding_bias_words=np.array([[b"a,b", b""]], dtype=object),
        embedding_bias_weights=np.array([[2.0, 3.0]], dtype=np.float32),
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
    assert g.cache_salt == "tenant-7" and g.prediction == "Hi there"
    assert g.temperature == pytest.approx(0.7) and g.top_p == pytest.approx(0.9)
    assert g.repetition_penalty == pytest.approx(1.3)
    assert (g.presence_penalty, g.frequency_penalty) == (0.5, 0.25)
    assert g.seed == 2**63 + 5
    assert list(g.stop) == ["a", "b", "c"]  # CSV inside each string, as the BLS model reads them
    assert list(g.bad_words) == ["x"] and g.return_log_probs and g.top_log_probs == 4 and g.prompt_log_probs
    # pairwise; a repeated id's biases summed; an embedding-bias entry is one word (no CSV), "" dropped
    assert g.logit_bias == {5: 2.0, 9: -100.0} and tuple(g.embedding_bias) == (("a,b", 2.0),)
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
        ({"text_input": "x", "top_log_probs": np.array([[3]], dtype=np.int32)}, "top_log_probs"),
        ({"text_input": "x", "logit_bias_ids": np.array([[3]], dtype=np.int32)}, "logit_bias_values"),
        (
            {"text_input": "x", "logit_bias_ids": np.array([[3, 4]]), "logit_bias_values": np.array([[1.0]])},
            "logit_bias_values",
        ),
        (
            {"text_input": "x", "logit_bias_ids": np.array([[3]]), "logit_bias_values": np.array([[np.inf]])},
            "logit_bias_values",
        ),
        ({"text_input": "x", "embedding_bias_weights": np.array([[1.0]])}, "embedding_bias_words"),
        (
            {"text_input": "x", "return_log_probs": np.array([[True]]), "top_log_probs": np.array([[21]])},
            "top_log_probs",
        ),
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
    # every input is optional to Triton: text_input or input_ids, the parser checks which
    assert [s.name for s in INPUTS if not s.optional] == []
    inputs = {s.name: (s.triton_type, s.dims) for s in INPUTS}
    outputs = {s.name: (s.triton_type, s.dims) for s in OUTPUTS}
    assert {name: inputs.get(name) for name in BLS_INPUTS} == BLS_INPUTS
    assert {name: outputs.get(name) for name in BLS_OUTPUTS} == BLS_OUTPUTS
    # ours: the older BLS names, and our own outputs
    assert {s.name for s in INPUTS if s.status == "extension"} == set(inputs) - set(BLS_INPUTS)
    assert {s.name for s in OUTPUTS if s.status == "extension"} == set(outputs) - set(BLS_OUTPUTS)
    assert all(s.why for s in (*INPUTS, *OUTPUTS) if s.status == "refused")


PROMPT_TOP = TokenAlternatives((1, 2), (-0.1, -3.0))


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
        # the second token's distribution (top-k 1) gives one token of the two asked for
        top_log_probs=(2, [TokenAlternatives((7, 3), (-0.5, -1.25)), TokenAlternatives((4,), (0.0,))]),
        prompt_log_probs=(2, PromptLogProbs(1, [-3.0, -0.5, -2.0], [PROMPT_TOP] * 3)),
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
    shaped = ("text_output", "output_log_probs", "output_top_token_ids", "output_top_log_probs")
    shaped += ("prompt_log_probs", "prompt_top_token_ids", "prompt_top_log_probs")
    assert all(t.shape == (1, 1) for n, t in final.items() if n not in shaped)
    assert final["output_top_token_ids"].tolist() == [[[[7, 3], [4, -1]]]]
    assert final["output_top_token_ids"].dtype == np.int32
    lowest = float(np.finfo(np.float32).min)  # padding: not -inf, which Triton's JSON cannot carry
    assert final["output_top_log_probs"].tolist() == [[[[-0.5, -1.25], [0.0, lowest]]]]
    assert final["prompt_log_probs"].tolist() == [[-3.0, -0.5, -2.0]]
    assert final["prompt_top_token_ids"].shape == (1, 3, 2)
    assert final["prompt_top_token_ids"][0, 2].tolist() == [1, 2]
    assert final["prompt_top_log_probs"].dtype == np.float32
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
    assert as_tensor_error(InvalidInputError("logit_bias", "x")).field == "logit_bias_ids"


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


def test_ignore_eos_means_no_end_id() -> None:
    yes, no = np.array([[True]]), np.array([[False]])
    assert parse(text_input="x", ignore_eos=yes).generation.end_id == -1
    assert parse(text_input="x", ignore_eos=no, end_id=np.array([[7]])).generation.end_id == 7
    assert parse(text_input="x", ignore_eos=yes, end_id=np.array([[-1]])).generation.end_id == -1
    with pytest.raises(InvalidInputError, match="ignore_eos: true means no end id, but end_id is 7"):
        parse(text_input="x", ignore_eos=np.array([[True]]), end_id=np.array([[7]]))


def test_a_prompt_comes_as_text_or_as_token_ids() -> None:
    ids = parse(input_ids=np.array([[5, 6, 7]], dtype=np.int32)).generation
    assert list(ids.prompt_token_ids or []) == [5, 6, 7] and ids.prompt == ""
    # BLS clients often send an empty text_input beside it
    beside = parse(text_input="", input_ids=np.array([[5]], dtype=np.int32)).generation
    assert list(beside.prompt_token_ids or []) == [5]
    assert parse(text_input="hi").generation.prompt_token_ids is None
    for values, message in (
        ({"text_input": "hi", "input_ids": np.array([[5]])}, "not both"),
        ({"input_ids": np.zeros((1, 0), dtype=np.int32)}, "must not be empty"),
        ({}, "is required"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            parse(**values)
    assert as_tensor_error(InvalidInputError("prompt_token_ids", "x")).field == "input_ids"
    rows = parse_batch(tensors(input_ids=np.array([[5, 6], [7, 8]], dtype=np.int32)).get, DEFAULTS)
    assert [list(r.generation.prompt_token_ids or []) for r in rows] == [[5, 6], [7, 8]]


def test_a_cache_salt_is_read_and_required_where_the_server_says() -> None:
    assert parse(text_input="x").generation.cache_salt is None
    assert parse(text_input="x", cache_salt="").generation.cache_salt is None  # "": not sent
    required = tensors(text_input="x")
    with pytest.raises(InvalidInputError, match="cache_salt: is required by this server"):
        parse_inputs(required.get, DEFAULTS, require_cache_salt=True)
    salted = tensors(text_input="x", cache_salt="a")
    assert parse_inputs(salted.get, DEFAULTS, require_cache_salt=True).generation.cache_salt == "a"
