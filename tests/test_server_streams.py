"""End to end, through real tritonclient against the shared real server (``e2e_server``): gRPC streams
and HTTP ``generate_stream`` give ``specdec-generate``'s text, one-shot responses and
``specdec-client`` too; streams join a running batch in flight; a seeded request gives the same
text alone and among seven others.
"""

from __future__ import annotations

import subprocess
import threading

import pytest
from e2e_server import MAX_TOKENS, PROMPTS, Anchor, StreamResult, grpc_stream, reference
from served import BIN, Server

pytestmark = [pytest.mark.server, pytest.mark.real_model]


Expected = dict[tuple[str, int], str]  # specdec-generate's text by (prompt, k)
QUESTIONS = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(16)]


@pytest.fixture(scope="module")
def server(e2e_server: Server) -> Server:
    """The real server the test_server_*.py files share (``e2e_server``)."""
    return e2e_server


@pytest.fixture(scope="module")
def expected() -> Expected:
    """``specdec-generate``'s text by (prompt, k): two runs (a model load each) for the whole file, its
    prompts batched (greedy text does not depend on the batch: test_batch_invariance.py)."""
    found: Expected = {}
    for prompts, k in (([*PROMPTS, *QUESTIONS], 4), (PROMPTS, 0)):
        found |= {(prompt, k): text for prompt, text in zip(prompts, reference(prompts, k))}
    return found


# -- 1. the served text is exactly specdec-generate's, over gRPC and HTTP -------------------------
@pytest.mark.parametrize("k", [0, 4])
def test_grpc_and_http_streams_match_specdec_generate(server: Server, expected: Expected, k: int) -> None:
    from trispec_client.client import SpecDecClient

    wanted = [expected[prompt, k] for prompt in PROMPTS]
    for prompt, want in zip(PROMPTS, wanted):
        got = grpc_stream(server, prompt, max_tokens=MAX_TOKENS, num_draft_tokens=k, stream=True)
        assert got.error is None, got.error
        assert got.text == want, prompt
        assert got.responses > 1
        assert got.final["finish_reason"] in (b"length", b"stop")
        # the k planned per round: never above the request's, and 0 throughout for plain
        assert 0 <= got.final["mean_num_draft_tokens"] <= k
        if k == 0:
            assert got.final["draft_tokens"] == 0
    http = SpecDecClient(server.http, protocol="http", timeout_s=120)
    for prompt, want in zip(PROMPTS, wanted):
        chunks = list(http.stream(prompt, max_tokens=MAX_TOKENS, num_draft_tokens=k))
        assert "".join(c.text for c in chunks) == want, prompt
        assert chunks[-1].final


def test_one_shot_response_carries_prompt_and_text(server: Server, expected: Expected) -> None:
    want = expected[PROMPTS[0], 4]
    got = grpc_stream(server, PROMPTS[0], max_tokens=MAX_TOKENS, stream=False)
    assert got.responses == 1 and got.text == PROMPTS[0] + want
    got = grpc_stream(server, PROMPTS[0], max_tokens=MAX_TOKENS, exclude_input_in_output=True)
    assert got.text == want


def test_specdec_client_cli(server: Server, expected: Expected) -> None:
    want = expected[PROMPTS[0], 4]
    for protocol, url in (("grpc", server.grpc), ("http", server.http)):
        command = [str(BIN / "specdec-client"), "generate", PROMPTS[0], "--url", url, "--protocol", protocol]
        command += ["--max-tokens", str(MAX_TOKENS), "--num-draft-tokens", "4", "--timeout", "120"]
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.rstrip("\n") == want.rstrip("\n")
        assert "accept" in run.stderr


def test_streams_join_a_running_batch_in_flight(server: Server, expected: Expected) -> None:
    """16 streams sent while a long stream runs all finish exact while it is still running, and the
    server's own counters show them sharing verify passes with it. With in-flight batching broken
    (e.g. scheduler.max_batch_size: 1) they would wait behind the long stream: this test fails."""
    steps_before = server.metric("specdec_verify_steps_total")
    rounds_before = server.metric("specdec_verify_rounds_total")
    anchor = Anchor(server, "Tell me a very long story about the sea.")
    results: list[StreamResult | BaseException | None] = [None] * 16

    def run(i: int) -> None:
        try:
            results[i] = grpc_stream(
                server, QUESTIONS[i], max_tokens=MAX_TOKENS, num_draft_tokens=4, stream=True
            )
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    long = anchor.stop()
    assert long.error is None and "finished" not in long.final, "the long stream ended before the others"
    for i, result in enumerate(results):
        assert isinstance(result, StreamResult) and result.error is None, (i, result)
        assert result.text == expected[QUESTIONS[i], 4], QUESTIONS[i]
    # every round of the 16 shared its verify pass with the long stream (at least), so the rounds
    # exceed the passes by at least one per such round, and each request had one round or more
    steps = server.metric("specdec_verify_steps_total") - steps_before
    rounds = server.metric("specdec_verify_rounds_total") - rounds_before
    assert rounds - steps >= 16, (rounds, steps)


def test_seeded_request_same_text_alone_and_among_seven_others(server: Server) -> None:
    seeded = {
        "max_tokens": MAX_TOKENS,
        "num_draft_tokens": 4,
        "temperature": 0.8,
        "seed": 1234,
        "stream": True,
    }
    alone = grpc_stream(server, PROMPTS[2], **seeded)
    assert alone.error is None and alone.text
    others = [
        # max_tokens: room in the KV pool for all seven (each reserves prompt + max_tokens)
        Anchor(server, prompt, temperature=0.7, seed=100 + i, num_draft_tokens=i % 5, max_tokens=600)
        for i, prompt in enumerate([*PROMPTS, *PROMPTS[:3]])
    ]
    try:
        batched = grpc_stream(server, PROMPTS[2], **seeded)
    finally:
        stopped = [anchor.stop() for anchor in others]
    assert all(s.error is None and "finished" not in s.final for s in stopped)
    assert batched.error is None and batched.text == alone.text
    # a different seed gives different text: the comparison above is not vacuous
    assert grpc_stream(server, PROMPTS[2], **{**seeded, "seed": 4321}).text != alone.text
