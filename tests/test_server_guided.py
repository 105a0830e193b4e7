"""Structured output through NVIDIA's tensors against the shared real server (``e2e_server``, the
default model): a request end id the grammar needs as text is text there, over Triton's generate
endpoint (issue 54, item 7); a regex shapes the text and a bad one is refused over gRPC."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from e2e_server import grpc_stream
from served import Server
from trispec_openai.tokens import ServedTokenizer

pytestmark = [pytest.mark.server, pytest.mark.real_model]


@pytest.fixture(scope="module")
def server(e2e_server: Server) -> Server:
    """The real server the test_server_*.py files share (``e2e_server``)."""
    return e2e_server


@pytest.fixture(scope="module")
def token_id() -> object:
    tokenizer = ServedTokenizer.from_config(None).tokenizer

    def one(text: str) -> int:
        (token,) = tokenizer.encode(text, add_bos=False)
        return token

    return one


def generate(server: Server, **body: object) -> dict:
    """One request to Triton's generate endpoint (HTTP, one response)."""
    body = {"exclude_input_in_output": True, **body}
    request = urllib.request.Request(
        f"http://{server.http}/v2/models/specdec/generate", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


@pytest.mark.parametrize(
    ("regex", "end", "want"),
    [
        ("ab\ncd", "\n", "ab\ncd"),  # the reproduction
        (r"[0-9]{2}\.[0-9]{2}", ".", None),  # the end id as text, then as the end
        ("ab(\ncd)?", "\n", "ab"),  # where the grammar may end, the end id ends it
    ],
)
def test_an_end_id_the_grammar_needs_as_text_is_text_there(
    server: Server, token_id, regex: str, end: str, want: str | None
) -> None:  # type: ignore[no-untyped-def]
    answer = generate(
        server,
        text_input="Write it:",
        max_tokens=16,
        end_id=token_id(end),
        guided_decoding_guide_type="regex",
        guided_decoding_guide=regex,
    )
    text = answer["text_output"]
    assert answer["finish_reason"] == "stop", answer
    if want is not None:
        assert text == want, answer
    else:  # complete after the last digit: the end id "." there ends it, unseen
        assert re.fullmatch(regex, text), answer


def test_a_regex_shapes_the_text_and_a_bad_one_is_refused(server: Server) -> None:
    year = grpc_stream(
        server,
        "The year after 2024 is",
        guided_decoding_guide_type=["regex"],
        guided_decoding_guide=[r"[0-9]{4}"],
        exclude_input_in_output=True,
        max_tokens=10,
    )
    assert year.error is None and len(year.text) == 4 and year.text.isdigit(), year
    broken = grpc_stream(server, "x", guided_decoding_guide_type=["regex"], guided_decoding_guide=["a[b"])
    assert broken.error is not None and "guided_decoding_guide: invalid regex" in str(broken.error)
