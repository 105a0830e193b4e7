"""specdec-openai: the OpenAI-compatible endpoint, spoken to with the official ``openai`` client.

The first tests need no server (chat template, request mapping, validation, token splitting, usage).
The rest start the real tritonserver (``test_server_e2e``'s module fixture) and ``specdec-openai`` as a
subprocess in front of it, and compare what comes back with what Triton itself answers.
"""

from __future__ import annotations

import csv
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from served import Server, openai_frontend
from test_server_e2e import server  # noqa: F401 -- the module-scoped server fixture
from trispec_client import SpecDecClient
from trispec_client.results import SpeculationStats
from trispec_openai.chat import ChatTemplate
from trispec_openai.choices import Choice, usage
from trispec_openai.errors import OpenAIError, from_model_message
from trispec_openai.mapping import jobs
from trispec_openai.schemas import ChatCompletionRequest, CompletionRequest
from trispec_openai.tokens import ServedTokenizer
from trispec_openai.triton import Piece

MODEL = "specdec"
PROMPT = "The capital of France is"
# greedy SmolLM2 keeps counting for hundreds of tokens: a generation that is still running when cut
LONG_PROMPT = "Count from 1 to 1000: 1, 2, 3, 4, 5,"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served_tokenizer() -> ServedTokenizer:
    return ServedTokenizer.from_config(None)


# -- without a server ---------------------------------------------------------------------------
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
    assert mapped[0].penalties == ()
    chat = ChatCompletionRequest(
        model=MODEL, messages=MESSAGES, max_completion_tokens=9, max_tokens=3, presence_penalty=0.5
    )
    chat_job = jobs(chat, ["p"])[0]
    assert chat_job.request.max_tokens == 9 and chat_job.penalties == (("presence_penalty", 0.5),)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": [1, 2]}, "prompt"),
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


# -- against the real server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def frontend(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
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
def test_completion_is_tritons_text_streamed_or_not(server: Server, client: openai.OpenAI) -> None:  # noqa: F811
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
    server: Server,  # noqa: F811
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

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2)
    assert "alternatives" in refused.value.message


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
    server: Server,  # noqa: F811
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
