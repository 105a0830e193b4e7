"""specdec-openai: the OpenAI-compatible endpoint, spoken to with the official ``openai`` client.

They start the real tritonserver (``e2e_server_in``) and ``specdec-openai`` as a subprocess in front of
it, and compare what comes back with what Triton itself answers; the parts that need no server (chat
template, request mapping, validation, token splitting, usage) are in ``test_openai_mapping``.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml
from e2e_server import e2e_server_in
from openai.types.chat import ChatCompletionMessageParam
from openai_cases import CITY, CITY_FORMAT, LONG_PROMPT, MESSAGES, MODEL, PROMPT, WEATHER
from served import Server, openai_frontend, openai_frontends
from trispec.config import DEFAULT_CONFIG_PATH, load_config
from trispec.serving.fingerprint import tokenizer_files
from trispec_client import SpecDecClient
from trispec_openai.tokens import ServedTokenizer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of this file's own, as the end-to-end files' (``e2e_server_in``)."""
    with e2e_server_in(tmp_path_factory) as srv:
        yield srv


@pytest.fixture(scope="module")
def served_tokenizer() -> ServedTokenizer:
    return ServedTokenizer.from_config(None)


# -- without a server ---------------------------------------------------------------------------
# -- against the real server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def frontend(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with openai_frontend(server.grpc, tmp_path_factory.mktemp("openai") / "frontend.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(frontend: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{frontend}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.mark.server
def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)


@pytest.mark.server
def test_completion_is_tritons_text_streamed_or_not(server: Server, client: openai.OpenAI) -> None:
    want = (
        SpecDecClient(server.grpc, timeout_s=120)
        .generate(PROMPT, max_tokens=16, exclude_input_in_output=True)
        .text
    )
    whole = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, extra_body={"num_draft_tokens": 4}
    )
    assert whole.object == "text_completion" and len(whole.choices) == 1
    assert whole.choices[0].text == want and whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage is not None and whole.usage.completion_tokens <= 16
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    extra = whole.usage.model_extra or {}
    assert extra["draft_tokens"] >= extra["accepted_tokens"] >= 0 and 0 <= extra["acceptance_rate"] <= 1

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == want
    assert text_chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


@pytest.mark.server
def test_stop_strings_end_the_text(client: openai.OpenAI) -> None:
    # "\n" and a comma inside a stop string survive the model's CSV reading of stop_words
    result = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, stop=["\n", "a,b"])
    assert result.choices[0].text == " Paris." and result.choices[0].finish_reason == "stop"


@pytest.mark.server
def test_penalties_reach_the_model(client: openai.OpenAI) -> None:
    # greedy counting repeats ", " and digits: a strong frequency penalty must change the text
    plain = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=12)
    penalised = client.completions.create(
        model=MODEL, prompt=LONG_PROMPT, max_tokens=12, frequency_penalty=2.0
    )
    assert plain.choices[0].text.startswith(" 6, 7, 8")
    assert penalised.choices[0].text != plain.choices[0].text


@pytest.mark.server
def test_chat_uses_the_models_template(
    server: Server,
    client: openai.OpenAI,
    served_tokenizer: ServedTokenizer,
) -> None:
    prompt = served_tokenizer.chat_template.render(MESSAGES)
    want = (
        SpecDecClient(server.grpc, timeout_s=120)
        .generate(prompt, max_tokens=20, exclude_input_in_output=True)
        .text
    )
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20)
    assert whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content == want
    assert whole.usage is not None and whole.usage.prompt_tokens == served_tokenizer.count(prompt)
    # the same chat was just sent by SpecDecClient: its prompt's blocks came from the prefix cache
    details = whole.usage.prompt_tokens_details
    assert details is not None and 16 <= (details.cached_tokens or 0) < whole.usage.prompt_tokens
    # another tenant's salt shares none of them; the second request of that salt does
    cached = []
    for _ in range(2):  # one after the other, streamed: the usage chunk says it too
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, stream=True, stream_options={"include_usage": True},
            extra_body={"cache_salt": "tenant-openai"},
        )  # fmt: skip
        cached.append(list(stream)[-1].usage.prompt_tokens_details.cached_tokens)  # type: ignore[union-attr]
    assert cached[0] == 0 and cached[1] == details.cached_tokens

    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


@pytest.mark.server
def test_n_choices_are_seeded_and_indexed(client: openai.OpenAI) -> None:
    def sample(stream: bool) -> list[str]:
        if not stream:
            result = client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=12, n=2, temperature=1.0, seed=3
            )
            return [c.text for c in sorted(result.choices, key=lambda c: c.index)]
        texts = ["", ""]
        for chunk in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, n=2, temperature=1.0, seed=3, stream=True
        ):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
        return texts

    whole = sample(stream=False)
    assert len(whole) == 2 and whole[0] != whole[1]  # seed and seed + 1
    assert sample(stream=True) == whole  # seeded: the same texts again, streamed
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, n=2, seed=3, temperature=1.0
    )
    assert sorted(c.index for c in chat.choices) == [0, 1]


@pytest.mark.server
def test_logprobs(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, logprobs=0)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert len(logprobs.token_logprobs) == completion.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(logprobs.tokens) == completion.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)

    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, logprobs=True)
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(t.logprob <= 0 and t.top_logprobs == [] for t in content)

    streamed = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=10,
        logprobs=True,
        stream=True,
    )
    values = [
        t.logprob
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert values == pytest.approx([t.logprob for t in content], abs=1e-4)  # greedy: the same tokens


@pytest.mark.server
def test_top_logprobs_list_the_most_likely_tokens(
    client: openai.OpenAI, served_tokenizer: ServedTokenizer
) -> None:
    chat = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for t in content:
        values = [a.logprob for a in t.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and values[0] <= 0
        # greedy: the token emitted is the most likely one, so its log-prob is the first alternative's
        assert values[0] == pytest.approx(t.logprob, abs=1e-6)
        for a in t.top_logprobs:
            # the token's text where its bytes are whole characters, else the bytes spelled out
            raw = bytes(a.bytes or [])
            spelled = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            assert a.token in (raw.decode("utf-8", "replace"), spelled)
    # the first alternatives are the tokens emitted: their bytes are the answer's, then its end token
    emitted = b"".join(bytes(t.top_logprobs[0].bytes or []) for t in content).decode("utf-8")
    answer = chat.choices[0].message.content or ""
    ends = {served_tokenizer.token_string(i) for i in served_tokenizer.tokenizer.eos_ids}
    assert emitted.startswith(answer) and emitted[len(answer) :] in {"", *ends}
    streamed = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, logprobs=True, top_logprobs=3, stream=True
    )
    streamed_top = [
        [(a.token, a.logprob) for a in t.top_logprobs]
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert streamed_top == [[(a.token, a.logprob) for a in t.top_logprobs] for t in content]

    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None and logprobs.token_logprobs is not None
    assert len(logprobs.top_logprobs) == len(logprobs.token_logprobs) == 8
    for top, lp in zip(logprobs.top_logprobs, logprobs.token_logprobs):
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(lp, abs=1e-6)

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, top_logprobs=2)
    assert "needs logprobs: true" in refused.value.message


@pytest.mark.server
@pytest.mark.parametrize("stream", [False, True])
def test_bad_requests_get_openai_errors(client: openai.OpenAI, stream: bool) -> None:
    # refused by our validation
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, temperature=-1, stream=stream)
    assert refused.value.status_code == 400
    error = refused.value.body
    assert (
        isinstance(error, dict)
        and error["param"] == "temperature"
        and error["type"] == "invalid_request_error"
    )
    assert set(error) == {"message", "type", "param", "code"}
    # refused by the model in Triton (a draft count above scheduler.max_num_draft_tokens)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, stream=stream, extra_body={"num_draft_tokens": 1000}
        )
    assert refused.value.body["param"] == "num_draft_tokens"  # type: ignore[index]


@pytest.mark.server
def test_malformed_bodies_are_400_in_openai_shape(frontend: str) -> None:
    for body in (b"{not json", b'{"model": "specdec", "prompt": "x", "max_tokenz": 3}', b"[]"):
        request = urllib.request.Request(
            f"{frontend}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 400
        error = json.loads(refused.value.read())["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
    assert "max_tokenz" in error["message"] or error["param"] is None


@pytest.mark.server
@pytest.mark.parametrize("stream", [True, False])
def test_client_going_away_cancels_the_triton_request(
    server: Server,
    client: openai.OpenAI,
    stream: bool,
) -> None:
    before = server.metric_or_zero("specdec_requests_total", finish_reason="cancelled")
    if stream:
        chunks = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1000, stream=True)
        next(iter(chunks))
        chunks.close()
    else:  # a client-side timeout closes the connection while the whole answer is being generated
        with pytest.raises(openai.APITimeoutError):
            client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1000, timeout=1.0)
    deadline = time.monotonic() + 30
    while server.metric_or_zero("specdec_requests_total", finish_reason="cancelled") <= before:
        assert time.monotonic() < deadline, "the request was not cancelled in the model"
        time.sleep(0.2)


# -- structured output and tools (docs/openai.md#structured-output) ------------------------------


@pytest.mark.server
def test_response_format_json_schema_validates_whatever_k_and_streamed(
    client: openai.OpenAI, served_tokenizer: ServedTokenizer
) -> None:
    import jsonschema

    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "The capital of France as JSON with city and population."}
    ]
    texts = []
    for k in (0, 4, 8):
        answer = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=60,
            response_format=CITY_FORMAT,  # type: ignore[arg-type]
            extra_body={"num_draft_tokens": k},
        )
        texts.append(answer.choices[0].message.content)
        assert answer.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=60,
        response_format=CITY_FORMAT,
        stream=True,  # type: ignore[arg-type]
    )
    texts.append("".join(c.choices[0].delta.content or "" for c in streamed if c.choices))
    assert len(set(texts)) == 1, texts
    jsonschema.validate(json.loads(texts[0] or ""), CITY)
    # json_object: greedy SmolLM2 opens an object and adds members for ever; a bias toward "}" has
    # it close the object: complete, with members, in xgrammar's whitespace
    (close,) = served_tokenizer.tokenizer.encode("}", add_bos=False)
    as_object = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=60,
        response_format={"type": "json_object"},
        logit_bias={str(close): 6},
    )
    assert as_object.choices[0].finish_reason == "stop", as_object
    value = json.loads(as_object.choices[0].message.content or "")
    assert isinstance(value, dict) and value, value
    cut = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, response_format=CITY_FORMAT
    )  # type: ignore[arg-type]
    assert cut.choices[0].finish_reason == "length"


@pytest.mark.server
@pytest.mark.parametrize("stream", [False, True])
def test_tools_come_back_as_tool_calls(client: openai.OpenAI, stream: bool) -> None:
    import jsonschema

    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Weather in Paris, in celsius?"}
    ]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in ("required", named):
        kw = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": 60,
            "tools": [WEATHER],
            "tool_choice": choice,
        }
        if not stream:
            message = client.chat.completions.create(**kw).choices[0]  # type: ignore[call-overload]
            calls, reason = message.message.tool_calls, message.finish_reason
            name, arguments = calls[0].function.name, calls[0].function.arguments
        else:
            name, arguments, reason = "", "", None
            for chunk in client.chat.completions.create(**kw, stream=True):  # type: ignore[call-overload]
                for piece in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    name += piece.function.name or ""
                    arguments += piece.function.arguments or ""
                reason = (chunk.choices[0].finish_reason if chunk.choices else None) or reason
        assert (name, reason) == ("get_weather", "tool_calls")
        jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])  # type: ignore[index]


@pytest.mark.server
def test_bad_guides_are_refused_naming_the_field(client: openai.OpenAI) -> None:

    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuch"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, response_format=bad)  # type: ignore[arg-type]
    assert refused.value.body["param"] == "response_format" and "nosuch" in refused.value.message  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[WEATHER], tool_choice="auto")  # type: ignore[list-item]
    assert refused.value.body["param"] == "tool_choice"  # type: ignore[index]
    # (NVIDIA's tensors through plain tritonclient: tests/test_server_guided.py)


@pytest.mark.server
def test_a_frontend_started_for_another_tokenizer_is_refused(
    server: Server, client: openai.OpenAI, tmp_path: Path
) -> None:
    """An endpoint whose ``--config`` names another tokenizer (here: the same vocabulary with another
    chat template) gets 500 ``tokenizer_mismatch`` naming the fix, not answers to prompts formatted for
    another model; the endpoint started for the server's own tokenizer (``client``) is served."""
    config = load_config(None)
    files = tokenizer_files(config.target, "target")  # tokenizer.json, tokenizer_info.json
    for source in files:
        shutil.copy(source, tmp_path / source.name)
    info_path = tmp_path / files[1].name
    info = json.loads(info_path.read_text())
    info["chat_template"] = info["chat_template"].replace("<|im_start|>", "<|im_start|> ")
    info_path.write_text(json.dumps(info))
    yaml_path = tmp_path / "other.yaml"
    data = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    data["target"]["tokenizer"] = str(tmp_path / files[0].name)
    yaml_path.write_text(yaml.safe_dump(data))
    with openai_frontends([server.grpc], [tmp_path / "frontend.log"], "--config", str(yaml_path)) as urls:
        other = openai.OpenAI(base_url=f"{urls[0]}/v1", api_key="unused", timeout=120, max_retries=0)
        for call in (
            lambda: other.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4),
            lambda: other.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=True),
        ):
            with pytest.raises(openai.InternalServerError) as error:
                list(call())  # type: ignore[call-overload]
            assert error.value.status_code == 500
            body = error.value.body
            assert isinstance(body, dict) and body.get("code") == "tokenizer_mismatch", body
            assert "expected_tokenizer_sha256" in error.value.message and "--config" in error.value.message
    assert "misconfigured: the model refused its tokenizer" in (tmp_path / "frontend.log").read_text()
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert answer.choices[0].message.content


@pytest.mark.server
def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI, served_tokenizer: ServedTokenizer) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6).choices[0].text
    encode = served_tokenizer.tokenizer.backend.encode
    first = encode(plain, add_special_tokens=False).ids[0]
    banned = (
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logit_bias={str(first): -100})
        .choices[0]
        .text
    )
    assert encode(banned, add_special_tokens=False).ids[0] != first
    the = encode(" the", add_special_tokens=False).ids[0]
    for k in (0, 3):
        forced = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=6,
            logit_bias={str(the): 100},
            extra_body={"num_draft_tokens": k},
        )
        assert forced.choices[0].text == " the" * 6


@pytest.mark.server
def test_echo_scores_the_prompt_as_lm_eval_asks(client: openai.OpenAI) -> None:
    """lm-eval's loglikelihood request (echo, logprobs 1, max_tokens 1, temperature 0), and max_tokens 0:
    the prompt's tokens scored, the first with nothing before it (null)."""
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=1, temperature=0)
    generated = answer.choices[0].logprobs
    assert generated is not None and generated.tokens and generated.token_logprobs
    whole = PROMPT + answer.choices[0].text
    for max_tokens in (0, 1):
        echoed = client.completions.create(
            model=MODEL, prompt=whole, max_tokens=max_tokens, logprobs=1, temperature=0, echo=True
        )
        choice = echoed.choices[0]
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
        assert choice.text.startswith(whole) and "".join(lp.tokens) == choice.text
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
        # the answer's tokens, scored as part of a prompt, have the log-probs they were generated with
        n = len(generated.tokens)
        scored = lp.token_logprobs[len(lp.tokens) - max_tokens - n : len(lp.tokens) - max_tokens]
        assert scored == pytest.approx(generated.token_logprobs, abs=1e-4)
        # lm-eval's is_greedy: each scored token is its position's most likely one (greedy answer)
        tops = lp.top_logprobs[len(lp.tokens) - max_tokens - n : len(lp.tokens) - max_tokens]
        assert all(tok == pytest.approx(max(top.values()), abs=1e-6) for tok, top in zip(scored, tops))
        assert echoed.usage is not None and echoed.usage.completion_tokens == max_tokens
        if max_tokens == 0:
            assert choice.text == whole and choice.finish_reason == "length"
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, echo=True, stream=True)
    texts = [c.choices[0].text for c in streamed if c.choices]
    assert texts[0].startswith(PROMPT) and "".join(texts).startswith(PROMPT)
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert "echo" in refused.value.message


@pytest.mark.server
def test_a_prompt_of_token_ids_is_the_same_prompt(
    client: openai.OpenAI, served_tokenizer: ServedTokenizer
) -> None:
    """lm-eval's default (tokenized_requests): token-id prompts, scored and answered as their text is."""
    ids = served_tokenizer.tokenizer.encode(PROMPT)
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=1, echo=True)
    by_ids = client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=1, logprobs=1, echo=True)
    assert (
        len(by_ids.choices) == 2 and by_ids.usage is not None and by_ids.usage.prompt_tokens == 2 * len(ids)
    )
    for choice in by_ids.choices:
        assert choice.text == by_text.choices[0].text
        assert choice.logprobs is not None and by_text.choices[0].logprobs is not None
        assert choice.logprobs.token_logprobs == by_text.choices[0].logprobs.token_logprobs
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=[10**6], max_tokens=1)
    assert refused.value.body is not None and "input_ids" in refused.value.message


@pytest.mark.server
def test_vllm_tokenizer_routes_are_served(frontend: str, served_tokenizer: ServedTokenizer) -> None:
    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(
            f"{frontend}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    ids = post("/tokenize", {"model": MODEL, "prompt": PROMPT, "add_special_tokens": False})["tokens"]
    assert ids == served_tokenizer.tokenizer.encode(PROMPT, add_bos=False)
    assert post("/detokenize", {"tokens": ids}) == {"prompt": PROMPT}
    with urllib.request.urlopen(f"{frontend}/tokenizer_info", timeout=30) as response:
        assert json.load(response)["eos_token"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        post("/tokenize", {"model": "gpt-4", "prompt": "x"})
    assert refused.value.code == 404


@pytest.mark.server
def test_a_prediction_is_drafted_from_and_counted(client: openai.OpenAI) -> None:
    """OpenAI's Predicted Outputs: the same text, its drafts counted in completion_tokens_details."""
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    answer = plain.choices[0].message.content or ""
    for prediction, accepting in ((answer, True), ("Zebras are striped.", False)):
        predicted = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=16,
            temperature=0,
            prediction={"type": "content", "content": prediction},
        )
        assert predicted.choices[0].message.content == answer
        usage = predicted.usage
        assert usage is not None and usage.completion_tokens_details is not None
        accepted = usage.completion_tokens_details.accepted_prediction_tokens or 0
        assert (accepted >= usage.completion_tokens // 2) == accepting, usage
    assert plain.usage is not None and plain.usage.completion_tokens_details is None


@pytest.mark.server
def test_benchmark_clients_payloads_are_served(frontend: str, server: Server) -> None:
    """What vLLM's and SGLang's serving benchmarks send: OpenAI completions with ignore_eos and
    best_of 1 (every token generated), and Triton's generate_stream with accumulate_tokens. The prompt
    is one greedy SmolLM2 ends early by itself: without ignore_eos the same requests stop there."""
    prompt = "Say yes."  # greedy SmolLM2 answers "\n\nThe answer is: 1." and its end token

    def complete(**extra: object) -> dict:
        body = {"model": MODEL, "prompt": prompt, "temperature": 0.0, "best_of": 1, "max_tokens": 24}
        request = urllib.request.Request(
            f"{frontend}/v1/completions",
            json.dumps({**body, "stream": False, **extra}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    answer, ended = complete(ignore_eos=True), complete()
    assert answer["usage"]["completion_tokens"] == 24 and answer["choices"][0]["finish_reason"] == "length"
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] < 24, ended
    assert answer["choices"][0]["text"].startswith(ended["choices"][0]["text"])

    def stream(**extra: object) -> dict:
        body = {"accumulate_tokens": True, "text_input": prompt, "max_tokens": 24, "stream": True, **extra}
        request = urllib.request.Request(
            f"http://{server.http}/v2/models/{MODEL}/generate_stream", json.dumps(body).encode()
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            lines = response.read().decode().splitlines()
        events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
        assert events and "error" not in events[-1], events
        return events[-1]

    final, stopped = stream(ignore_eos=True), stream()
    assert final["output_token_count"] == 24 and final["finish_reason"] == "length", final
    assert stopped["finish_reason"] == "stop" and stopped["output_token_count"] < 24, stopped
