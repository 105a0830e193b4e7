"""specdec-client's command line: flags and defaults, bad arguments, text on stdout and the summary on
stderr, JSON output, exit codes, Ctrl-C; against a stand-in client, and once over HTTP against the
scripted SSE server.
"""

from __future__ import annotations

import io
import json

import pytest
from client_stand_ins import FINAL_EVENT, FakeClient, Script, _run_cli, sse
from trispec_client import (
    InvalidRequestError,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecTimeoutError,
    cli,
)


def test_cli_defaults_and_flags() -> None:
    args = cli.parse_args(["generate", "Hello"])
    assert (args.text, args.url, args.protocol, args.stream, args.timeout, args.model) == (
        "Hello",
        None,
        "grpc",
        True,
        60.0,
        "specdec",
    )
    assert args.stop == [] and args.max_tokens is None and not args.json
    args = cli.parse_args(
        [
            "generate",
            "Hi",
            "--no-stream",
            "--protocol",
            "http",
            "--stop",
            "a",
            "--stop",
            "b",
            "--top-p",
            "0.5",
        ]
    )
    assert (args.stream, args.protocol, args.stop, args.top_p) == (False, "http", ["a", "b"], 0.5)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["generate"],
        ["generate", "x", "--protocol", "ws"],
        ["generate", "x", "--timeout", "0"],
        ["generate", "x", "--timeout", "inf"],
        ["generate", "x", "--max-tokens", "many"],
        ["generate", "x", "--retries", "-1"],
    ],
)
def test_cli_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", "--help"]) == 0
    assert "--num-draft-tokens" in capsys.readouterr().out


def test_cli_streams_text_then_summary_on_stderr(fake_client: type[FakeClient]) -> None:
    code, out, err = _run_cli(
        [
            "generate",
            "Capital?",
            "--max-tokens",
            "2",
            "--seed",
            "3",
            "--stop",
            ".",
            "--timeout",
            "9",
            "--cache-salt",
            "t1",
        ]
    )
    assert code == 0
    assert out == "Paris is\n"
    assert err == "[2 tokens, length; drafted 12, accepted 9 (75%), mean accepted length 3.25]\n"
    client = fake_client.made[0]
    assert client.init == {
        "url": None,
        "protocol": "grpc",
        "model": "specdec",
        "timeout_s": 9.0,
        "retries": 3,
        "resume": True,
        "resume_timeout_s": 60.0,
        "routing": "prefix",
        "route_prefix_chars": 1024,
    }
    name, prompt, kwargs = client.calls[0]
    assert (name, prompt) == ("stream", "Capital?")
    assert kwargs["max_tokens"] == 2 and kwargs["seed"] == 3 and kwargs["stop_words"] == ["."]
    assert kwargs["cache_salt"] == "t1"
    assert kwargs["temperature"] is None  # unset flags stay unset: server defaults


def test_cli_no_stream_asks_for_text_without_the_prompt(fake_client: type[FakeClient]) -> None:
    code, out, _ = _run_cli(["generate", "Capital?", "--no-stream", "--protocol", "http"])
    assert code == 0 and out == "Paris is\n"
    name, _, kwargs = fake_client.made[0].calls[0]
    assert name == "generate" and kwargs["exclude_input_in_output"] is True
    assert fake_client.made[0].init["protocol"] == "http"
    _run_cli(["generate", "Capital?", "--retries", "0"])
    assert fake_client.made[1].init["retries"] == 0


def test_cli_json_prints_one_object(fake_client: type[FakeClient]) -> None:
    code, out, err = _run_cli(["generate", "Capital?", "--json"])
    assert code == 0 and err == ""
    assert json.loads(out) == {
        "text": "Paris is",
        "token_count": 2,
        "finish_reason": "length",
        "stats": {
            "draft_tokens": 12,
            "accepted_tokens": 9,
            "verify_rounds": 4,
            "acceptance_rate": 0.75,
            "mean_accepted_length": 3.25,
            "mean_num_draft_tokens": 3.0,
            "resumed": 0,
        },
        "seed": None,
        "model_fingerprint": None,
        "cached_tokens": None,
    }


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (InvalidRequestError("top_p: must be in (0, 1]"), 2),
        (SpecDecTimeoutError("no final response within 60 s"), 3),
        (SpecDecConnectionError("connection refused"), 1),
        (SpecDecError("engine exploded", "INTERNAL"), 1),
    ],
)
def test_cli_errors_map_to_exit_codes(fake_client: type[FakeClient], error: SpecDecError, code: int) -> None:
    fake_client.outcome = error
    got, out, err = _run_cli(["generate", "x"])
    assert got == code
    assert out == "partial\n"  # text so far, line ended
    assert err.startswith("specdec-client: error: ") and error.message in err


def test_cli_client_side_bad_value_exits_2() -> None:
    # a real client: the seed cannot be carried as UINT64, so nothing is sent
    code, _, err = _run_cli(["generate", "x", "--seed", "-1", "--url", "127.0.0.1:9"])
    assert code == 2 and "seed" in err


def test_cli_interrupt_cancels_the_stream(
    fake_client: type[FakeClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted_write(text: str) -> int:
        raise KeyboardInterrupt

    out = io.StringIO()
    monkeypatch.setattr(out, "write", interrupted_write)
    err = io.StringIO()
    assert cli.main(["generate", "x"], stdout=out, stderr=err) == 130
    assert fake_client.made[0].closed_early


def test_cli_over_http_end_to_end(sse_server: tuple[str, Script]) -> None:
    url, script = sse_server
    script.writes = [(0, sse({"text_output": "Bonjour", "output_token_count": 1})), (0, sse(FINAL_EVENT))]
    code, out, err = _run_cli(["generate", "Hello", "--protocol", "http", "--url", url, "--top-k", "5"])
    assert (code, out) == (0, "Bonjour\n")
    assert "3 tokens, length" in err
    assert script.requests[0][1] == {"text_input": "Hello", "top_k": 5, "stream": True}
