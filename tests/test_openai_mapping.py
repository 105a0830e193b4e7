"""The OpenAI front end's offline parts: chat templates, request mapping, refusals, usage and the
structured-output mapping, without a server (tests/test_openai.py serves them for real)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from openai_cases import CITY, CITY_FORMAT, MESSAGES, MODEL, PROMPT, WEATHER
from trispec_client.results import SpeculationStats
from trispec_openai.chat import ChatTemplate
from trispec_openai.choices import Choice, usage
from trispec_openai.errors import OpenAIError, from_model_message
from trispec_openai.formats import ChatFormat, CompletionFormat
from trispec_openai.mapping import jobs
from trispec_openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from trispec_openai.tokenizer_routes import detokenize, tokenize, tokenizer_info
from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import Piece, _alternatives


@pytest.fixture(scope="module")
def served_tokenizer() -> ServedTokenizer:
    return ServedTokenizer.from_config(None)


@pytest.mark.real_model
def test_chat_template_is_the_models_own(served_tokenizer: ServedTokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = served_tokenizer.chat_template.render(messages)
    # SmolLM2's template from its GGUF metadata: ChatML with the assistant turn opened
    assert (
        rendered
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered == served_tokenizer.tokenizer.apply_chat_template(messages)
    # no system message: the template adds its own default one
    assert served_tokenizer.chat_template.render(messages[1:]).startswith("<|im_start|>system\nYou are")


def test_chat_template_renders_as_transformers_does() -> None:
    # loop controls, tojson keeping non-ASCII text, bos/eos and the template's own raise_exception
    source = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m | tojson }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    messages = [{"role": "user", "content": "café"}, {"role": "assistant", "content": "a"}, {"role": "user"}]
    assert template.render(messages) == (
        '<s>{"role": "user", "content": "café"}\n{"role": "assistant", "content": "a"}\n<assistant>'
    )
    with pytest.raises(OpenAIError) as refused:
        template.render([{"role": "tool", "content": "x"}])
    assert refused.value.status == 400 and "no tools" in refused.value.message


def test_requests_map_to_triton_inputs() -> None:
    body = CompletionRequest(
        model=MODEL, prompt=["a", "b"], n=2, seed=7, stop=["x,y", "\n"], max_tokens=5, num_draft_tokens=3
    )
    mapped = jobs(body, body.prompts)
    assert [(j.index, j.prompt_index, j.request.prompt, j.request.seed) for j in mapped] == [
        (0, 0, "a", 7),
        (1, 0, "a", 8),
        (2, 1, "b", 7),
        (3, 1, "b", 8),
    ]
    request = mapped[0].request
    assert request.stream and request.max_tokens == 5 and request.num_draft_tokens == 3
    # the model reads each stop_words entry as a CSV row: every stop string must come back whole
    assert [w for s in request.stop_words for row in csv.reader([s]) for w in row] == ["x,y", "\n"]
    assert mapped[0].penalties == () and request.logit_bias is None and request.prompt_token_ids is None
    # token-id prompts: one (a list of ids) or several (a list of lists)
    one = CompletionRequest(model=MODEL, prompt=[5, 6, 7])
    assert one.prompts == [[5, 6, 7]]
    tokenized = jobs(one, one.prompts)[0].request
    assert tokenized.prompt == "" and tokenized.prompt_token_ids == (5, 6, 7)
    assert CompletionRequest(model=MODEL, prompt=[[5], [6, 7]]).prompts == [[5], [6, 7]]
    # vLLM's extras (its benchmark sends ignore_eos with every request)
    extras = CompletionRequest(model=MODEL, prompt="a", ignore_eos=True, min_tokens=3, repetition_penalty=1.2)
    job = jobs(extras, extras.prompts)[0]
    assert job.request.end_id == -1 and job.request.min_tokens == 3
    assert job.penalties == (("repetition_penalty", 1.2),)
    assert jobs(body, body.prompts)[0].request.end_id is None
    biased = CompletionRequest(model=MODEL, prompt="a", logit_bias={"50256": -100, "11": 3.5})
    assert jobs(biased, biased.prompts)[0].request.logit_bias == {50256: -100.0, 11: 3.5}
    chat = ChatCompletionRequest(
        model=MODEL, messages=MESSAGES, max_completion_tokens=9, max_tokens=3, presence_penalty=0.5
    )
    chat_job = jobs(chat, ["p"])[0]
    assert chat_job.request.max_tokens == 9 and chat_job.penalties == (("presence_penalty", 0.5),)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "logit_bias": {"a": 5}}, "logit_bias"),
        ({"prompt": "x", "logit_bias": {"1": 101}}, "logit_bias"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": ["a", "b"], "n": 9}, "n"),
    ],
)
def test_unsupported_fields_are_refused_with_the_reason(body: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        CompletionRequest.model_validate({"model": MODEL, **body})
    assert refused.value.status == 400 and refused.value.param == param
    assert refused.value.body()["error"]["param"] == param


def test_model_errors_get_their_status() -> None:
    assert from_model_message("top_p: must be in (0, 1]").param == "top_p"
    assert from_model_message("text_input: must not be empty").status == 400
    assert from_model_message("stop_words: bad").param == "stop"
    overloaded = "70 requests are waiting for a slot (scheduler.max_waiting 64); retry later"
    assert from_model_message(overloaded).status == 503
    assert from_model_message("generation failed: boom").status == 500
    # any input the model declares counts as bad input, under its own name where OpenAI has none
    refused = from_model_message("min_tokens: must be >= 0", {"text_input", "min_tokens"})
    assert refused.status == 400 and refused.param == "min_tokens"
    assert from_model_message("engine: broke", {"text_input"}).status == 500


@pytest.mark.real_model
def test_token_split_joins_back(served_tokenizer: ServedTokenizer) -> None:
    text = " Paris, the café of 🙂 Europe."
    for n in (1, 3, 40):
        pieces = served_tokenizer.split(text, n)
        assert len(pieces) == n and "".join(pieces) == text
    assert served_tokenizer.split("", 2) == ["", ""]
    exact = served_tokenizer.split(" Paris is", len(served_tokenizer.tokenizer.encode(" Paris is")))
    assert exact == [" Paris", " is"]


@pytest.mark.real_model
def test_usage_sums_choices_and_counts_each_prompt_once(served_tokenizer: ServedTokenizer) -> None:
    a, b = Choice(0, 0), Choice(1, 0)
    a.add(Piece("x", 4, final=True, stats=SpeculationStats(8, 6, 2, 0.75, 4.0, 4.0)), served_tokenizer)
    b.add(Piece("y", 2, final=True, stats=SpeculationStats(4, 0, 2, 0.0, 1.0, 2.0)), served_tokenizer)
    got = usage([a, b], [PROMPT], served_tokenizer)
    prompt_tokens = served_tokenizer.count(PROMPT)
    assert got["prompt_tokens"] == prompt_tokens and got["completion_tokens"] == 6
    assert got["total_tokens"] == prompt_tokens + 6
    assert got["draft_tokens"] == 12 and got["accepted_tokens"] == 6 and got["acceptance_rate"] == 0.5
    assert got["verify_rounds"] == 4 and got["mean_accepted_length"] == 2.5
    assert got["mean_num_draft_tokens"] == 3.0
    assert got["prompt_tokens_details"] == {"cached_tokens": 0}
    b.add(Piece("", 2, final=True, cached_tokens=5), served_tokenizer)
    assert usage([a, b], [PROMPT], served_tokenizer)["prompt_tokens_details"] == {"cached_tokens": 5}


def test_structure_of_maps_response_format_and_tools() -> None:
    from trispec_openai.structured import structure_of

    assert structure_of({"type": "text"}, None, None, "").guide_type is None
    guided = structure_of(CITY_FORMAT, None, None, "")
    assert (guided.guide_type, json.loads(guided.guide or "")) == ("json_schema", CITY)
    required = structure_of(None, [WEATHER], "required", "")
    assert required.param == "tools" and required.tools is not None and required.tools.mode == "wrapped"
    named = structure_of(None, [WEATHER], {"type": "function", "function": {"name": "get_weather"}}, "")
    assert json.loads(named.guide or "") == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert named.tools is not None and named.tools.calls('{"city":"Oslo","unit":"c"}')[0]["function"] == {  # type: ignore[index]
        "name": "get_weather",
        "arguments": '{"city": "Oslo", "unit": "c"}',
    }
    assert structure_of(None, [WEATHER], "auto", "{{ '<tool_call>' }}").tools.mode == "tagged"  # type: ignore[union-attr]
    tag = {"structures": [{"begin": "<f=w>", "schema": CITY, "end": "</f>"}], "triggers": ["<f="]}
    tagged = structure_of({"type": "structural_tag", **tag}, None, None, "")
    assert (tagged.guide_type, json.loads(tagged.guide or "")) == ("structural_tag", tag)
    for format_, tools, choice, param in (
        ({"type": "xml"}, None, None, "response_format"),
        ({"type": "structural_tag", "structures": {}}, None, None, "response_format"),
        (None, [WEATHER], "auto", "tool_choice"),  # SmolLM2's template has no tool calls
        (None, [WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, [{"type": "function"}], "required", "tools"),
        (None, None, "required", "tool_choice"),
    ):
        with pytest.raises(OpenAIError) as refused:
            structure_of(format_, tools, choice, "")
        assert refused.value.status == 400 and refused.value.param == param


def test_strict_refuses_what_openais_strict_mode_refuses() -> None:
    """OpenAI's Supported schemas under ``strict``: an object root, additionalProperties false and
    every property required in every object; refused with OpenAI's wording, the field named."""
    from trispec_openai.structured import structure_of

    where = {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}
    nested = CITY | {
        "properties": {**CITY["properties"], "where": where},
        "required": ["city", "population", "where"],
    }  # type: ignore[dict-item]
    refusals = (
        (
            {k: v for k, v in CITY.items() if k != "additionalProperties"},
            "context=(), 'additionalProperties'",
        ),
        (CITY | {"required": ["city"]}, "every key in properties. Missing 'population'"),
        (nested, "context=('properties', 'where'), 'additionalProperties' is required"),
        ({"anyOf": [CITY]}, "the root must be an object"),
    )
    for schema, message in refusals:
        spec = {"name": "city", "schema": schema, "strict": True}
        with pytest.raises(OpenAIError) as refused:
            structure_of({"type": "json_schema", "json_schema": spec}, None, None, "")
        assert (refused.value.status, refused.value.param) == (400, "response_format")
        assert "Invalid schema for response_format 'city'" in refused.value.message
        assert message in refused.value.message, refused.value.message
        # without strict the same schema is served (and enforced as TensorRT-LLM's xgrammar reads it)
        loose = structure_of({"type": "json_schema", "json_schema": spec | {"strict": False}}, None, None, "")
        assert loose.guide_type == "json_schema"
    assert structure_of(CITY_FORMAT, None, None, "").guide_type == "json_schema"  # strict and conforming
    function = {**WEATHER["function"], "strict": True, "parameters": {"type": "object", "properties": {}}}  # type: ignore[dict-item]
    with pytest.raises(OpenAIError) as refused:
        structure_of(None, [{"type": "function", "function": function}], "required", "")
    assert refused.value.param == "tools" and "function 'get_weather'" in refused.value.message
    with pytest.raises(OpenAIError, match="strict: must be a boolean"):
        structure_of({"type": "json_schema", "json_schema": {"name": "c", "strict": "yes"}}, None, None, "")


@pytest.mark.real_model
def test_alternatives_are_named_by_their_tokens_bytes(served_tokenizer: ServedTokenizer) -> None:
    encode = served_tokenizer.tokenizer.backend.encode
    paris, space = encode(" Paris").ids[0], encode(" ").ids[0]
    # a byte-level token holding the first byte of "é": its bytes spelled out, as OpenAI does
    partial = next(i for i in range(300) if served_tokenizer.token_bytes(i) == b"\xc3")
    assert served_tokenizer.token_string(paris) == " Paris"
    assert served_tokenizer.token_bytes(paris) == b" Paris"
    assert served_tokenizer.token_string(partial) == "bytes:\\xc3"
    # the model's [1, 1, tokens, N] tensors, padded with id -1 where top-k left fewer tokens
    ids = np.array([[[[paris, partial], [space, -1]]]], dtype=np.int32)
    values = np.array([[[[-0.25, -2.0], [-0.5, np.finfo(np.float32).min]]]], dtype=np.float32)
    piece = Piece(" Paris ", 2, logprobs=(-0.25, -0.5), top_logprobs=_alternatives(ids, values))
    assert piece.top_logprobs == (((paris, -0.25), (partial, -2.0)), ((space, -0.5),))
    choice = Choice(0, 0)
    delta = choice.add(piece, served_tokenizer)
    chat = ChatFormat(MODEL, True, top_logprobs=2).chunk(0, delta, None)
    assert chat is not None
    top = [t["top_logprobs"] for t in chat["choices"][0]["logprobs"]["content"]]
    assert top[0] == [
        {"token": " Paris", "logprob": -0.25, "bytes": list(b" Paris")},
        {"token": "bytes:\\xc3", "logprob": -2.0, "bytes": [0xC3]},
    ]
    assert top[1] == [{"token": " ", "logprob": -0.5, "bytes": [32]}]
    whole = CompletionFormat(MODEL, True, 2).response([choice], {})["choices"][0]["logprobs"]
    assert whole["top_logprobs"] == [{" Paris": -0.25, "bytes:\\xc3": -2.0}, {" ": -0.5}]
    assert list(whole["top_logprobs"][0]) == [" Paris", "bytes:\\xc3"]  # most likely first
    # logprobs 0: log-probs without alternatives, as before
    plain = CompletionFormat(MODEL, True).response([choice], {})["choices"][0]["logprobs"]
    assert plain["top_logprobs"] is None and plain["token_logprobs"] == [-0.25, -0.5]


@pytest.mark.real_model
def test_vllm_tokenizer_routes_answer_from_the_served_tokenizer(served_tokenizer: ServedTokenizer) -> None:
    ids = served_tokenizer.tokenizer.encode(PROMPT)
    answer = tokenize(TokenizeRequest(prompt=PROMPT, return_token_strs=True), served_tokenizer)
    assert answer["tokens"] == ids and answer["count"] == len(ids)
    assert "".join(answer["token_strs"]) == PROMPT
    chat = tokenize(TokenizeRequest(messages=MESSAGES), served_tokenizer)["tokens"]
    rendered = served_tokenizer.chat_template.render(MESSAGES)
    assert chat == served_tokenizer.tokenizer.encode(rendered, add_bos=False)
    assert detokenize(DetokenizeRequest(tokens=ids), served_tokenizer) == {"prompt": PROMPT}
    info = tokenizer_info(served_tokenizer)
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]
    for bad in ({}, {"prompt": "x", "messages": MESSAGES}):
        with pytest.raises(OpenAIError):
            TokenizeRequest.model_validate(bad)
    with pytest.raises(OpenAIError, match="not a token id"):
        detokenize(DetokenizeRequest(tokens=[10**7]), served_tokenizer)


def test_chat_template_kwargs_reach_the_template_but_never_replace_its_inputs() -> None:
    source = "{% if greeting %}{{ greeting }} {% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    template = ChatTemplate(source)
    messages = [{"role": "user", "content": "x"}]
    assert template.render(messages, None, {"greeting": "hi"}) == "hi x"
    assert template.render(messages, None, {"messages": [], "add_generation_prompt": False}) == "x"
