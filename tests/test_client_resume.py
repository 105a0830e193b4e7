"""trispec_client resuming a cut stream, without a server: sent again with its seed and the tokens to
skip, never spliced when the resumed stream differs, which failures are resumed, a bounded wait for
a server to come back; with several replicas, a stream resumes on another only where the same model
(fingerprint) serves it.
"""

from __future__ import annotations

import socket

import pytest
from client_stand_ins import QUEUE_FULL, STATS, FakeClient, Fleet, _run_cli
from trispec_client import (
    GenerationRequest,
    InvalidRequestError,
    SpecDecClient,
    SpecDecConnectionError,
    SpecDecError,
    SpecDecTimeoutError,
    StreamChunk,
    cli,
)
from trispec_client.errors import SpecDecResumeError, make_error, status_from_message
from virtual_clock import VirtualClock


def text_digest_of(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_a_cut_stream_is_sent_again_with_its_seed_and_the_tokens_to_skip() -> None:
    from trispec_client.resume import StreamResume, text_digest

    state = StreamResume(GenerationRequest("Hi", max_tokens=8, temperature=0.8))
    assert state.request().skip_output_tokens is None and not state.started
    state.take(StreamChunk("Bon", 2, seed=77))
    state.take(StreamChunk("jour", 3))
    state.cut(SpecDecConnectionError("Stream removed"))
    again = state.request()
    assert (again.seed, again.skip_output_tokens, again.temperature) == (77, 3, 0.8)
    # the resumed stream confirms the skipped text, then carries on; the final chunk says resumed: 1
    state.take(StreamChunk(" à", 5, skipped_text_sha256=text_digest("Bonjour")))
    final = state.take(StreamChunk("", 5, final=True, finish_reason="length", stats=STATS))
    assert final.stats is not None and final.stats.resumed == 1 and state.text == "Bonjour à"


@pytest.mark.parametrize(
    "first",
    [
        StreamChunk(" à", 5, skipped_text_sha256=text_digest_of("Bonsoir")),  # other text
        StreamChunk(" à", 5),  # no confirmation at all
        StreamChunk(" à", 5, seed=78, skipped_text_sha256=text_digest_of("Bonjour")),  # other seed
        StreamChunk(" à", 2, skipped_text_sha256=text_digest_of("Bonjour")),  # fewer tokens
    ],
)
def test_a_resumed_stream_that_differs_is_never_spliced(first: StreamChunk) -> None:
    from trispec_client.errors import SpecDecResumeError
    from trispec_client.resume import StreamResume

    state = StreamResume(GenerationRequest("Hi", temperature=0.8))
    state.take(StreamChunk("Bonjour", 3, seed=77))
    state.cut(SpecDecConnectionError("Stream removed"))
    with pytest.raises(SpecDecResumeError):
        state.take(first)
    assert state.text == "Bonjour"


REFUSED = "failed to connect to all addresses; Connection refused"


@pytest.mark.parametrize(
    ("error", "started", "reached", "cut"),
    [
        (SpecDecConnectionError("Stream removed (Socket closed)"), False, False, True),
        (SpecDecError("Stub process 'specdec_0_0' is not healthy."), False, False, True),
        (
            SpecDecConnectionError("connection failed: ('Connection broken: IncompleteRead(0 bytes read)')"),
            True,
            True,
            True,
        ),
        (SpecDecConnectionError(REFUSED), True, True, True),
        # a server this client had answers from is restarting; an address never reached is not waited for
        (SpecDecConnectionError(REFUSED), False, True, True),
        (SpecDecConnectionError(REFUSED), False, False, False),
        # a refusal for now of a new request is retried and raised as ever, not waited for
        (make_error(QUEUE_FULL, "UNAVAILABLE"), False, True, False),
        (make_error(QUEUE_FULL, "UNAVAILABLE"), True, True, True),  # a resume meeting a busy server
        (InvalidRequestError("top_p: must be in (0, 1]"), True, True, False),
        (SpecDecTimeoutError("no final response within 1 s"), True, True, False),
        (SpecDecError("generation failed: boom", "INTERNAL"), True, True, False),
    ],
)
def test_which_failures_are_resumed(error: SpecDecError, started: bool, reached: bool, cut: bool) -> None:
    from trispec_client.resume import is_cut

    assert is_cut(error, started=started, reached=reached) is cut


def test_cli_resumes_by_default_and_no_resume_turns_it_off(fake_client: type[FakeClient]) -> None:
    _run_cli(["generate", "Capital?"])
    _run_cli(["generate", "Capital?", "--no-resume", "--resume-timeout", "5"])
    assert [(c.init["resume"], c.init["resume_timeout_s"]) for c in fake_client.made] == [
        (True, 60.0),
        (False, 5.0),
    ]
    assert cli.main(["generate", "x", "--resume-timeout", "0"]) == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_waiting_for_a_server_to_come_back_is_bounded(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real readiness probes (refused), the pauses between them read off a virtual clock, not timed:
    growing pauses, a probe after each, and the wait ends once its 1.5 s have passed, never before."""
    from trispec_client import resume
    from trispec_client.resume import BACKOFF_INITIAL_S, pauses, wait_until_ready

    clock = VirtualClock()
    monkeypatch.setattr(resume, "time", clock)
    probes: list[float] = []  # each probe's own timeout
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: every readiness probe is refused
        client = SpecDecClient(f"127.0.0.1:{sock.getsockname()[1]}", protocol=protocol)  # type: ignore[arg-type]

        def probe(timeout_s: float) -> bool:
            probes.append(timeout_s)
            return client._model_ready(timeout_s)

        start = clock.monotonic()
        with pytest.raises(SpecDecConnectionError, match=r"not ready again within 1\.5 s"):
            wait_until_ready(probe, start, 1.5, pauses(), SpecDecConnectionError("Stream removed"))
    assert clock.monotonic() - start >= 1.5 and sum(clock.pauses) <= 1.5
    # doubling, each jittered to half-whole; the last cut to what was left (how many fit depends on
    # how long the real probes took)
    schedule = [BACKOFF_INITIAL_S * 2**i for i in range(len(clock.pauses))]
    assert clock.pauses and all(p <= most for p, most in zip(clock.pauses, schedule)), clock.pauses
    assert all(p >= most / 2 for p, most in zip(clock.pauses[:-1], schedule)), clock.pauses
    assert len(probes) == len(clock.pauses) and all(0 < t <= 2.0 for t in probes)


def test_a_resumed_stream_must_come_from_the_model_it_began_on() -> None:
    from trispec_client.resume import StreamResume, is_other_model, text_digest

    state = StreamResume(GenerationRequest("Hi", max_tokens=8))
    state.take(StreamChunk("Bon", 2, model_fingerprint="aaaa"))
    state.cut(SpecDecConnectionError("Stream removed"))
    assert state.request().expected_model_fingerprint == "aaaa"  # the replica checks it first
    assert state.request().sent_values()["expected_model_fingerprint"] == "aaaa"
    # a replica that answers anyway with another model's text is not continued
    with pytest.raises(SpecDecResumeError, match="serving model fingerprint bbbb, not aaaa"):
        state.take(StreamChunk("jour", 3, skipped_text_sha256=text_digest("Bon"), model_fingerprint="bbbb"))
    assert state.text == "Bon"
    message = "expected_model_fingerprint: this replica serves model fingerprint bbbb, not aaaa"
    refusal = make_error(message, status_from_message(message))  # as both transports classify it
    assert isinstance(refusal, InvalidRequestError) and is_other_model(refusal)
    assert not is_other_model(SpecDecConnectionError("Stream removed"))
    # a stream from a server without fingerprints is resumed as before, checked by its digest alone
    old = StreamResume(GenerationRequest("Hi"))
    old.take(StreamChunk("Bon", 2))
    old.cut(SpecDecConnectionError("Stream removed"))
    assert "expected_model_fingerprint" not in old.request().sent_values()


def test_a_stream_cut_on_one_replica_resumes_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    from trispec_client.resume import text_digest

    client = SpecDecClient("a:1,b:2", timeout_s=30, resume_timeout_s=5, routing="round-robin")
    assert client.urls == ["a:1", "b:2"]
    cut = SpecDecConnectionError("Stream removed")
    fleet = Fleet(
        client,
        monkeypatch,
        r0=[[StreamChunk("Bon", 2, seed=7, model_fingerprint="aaaa"), cut]],
        r1=[
            [
                StreamChunk("jour", 4, skipped_text_sha256=text_digest("Bon"), model_fingerprint="aaaa"),
                StreamChunk("", 4, final=True, finish_reason="length", stats=STATS),
            ]
        ],
    )
    fleet.ready[0] = False  # the replica that cut the stream is gone
    chunks = list(client.stream("Hi", temperature=0.8))
    assert "".join(c.text for c in chunks) == "Bonjour" and chunks[-1].stats.resumed == 1
    (first, _), (second, again) = fleet.sent
    assert (first, second) == (0, 1)
    assert (again.seed, again.skip_output_tokens, again.expected_model_fingerprint) == (7, 2, "aaaa")


def test_a_replica_serving_another_model_never_continues_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other replica refuses (another fingerprint): with no other ready replica serving the model
    the stream began on, the request ends in SpecDecResumeError after the text before the cut."""
    client = SpecDecClient(["a:1", "b:2", "c:3"], timeout_s=30, resume_timeout_s=5, routing="round-robin")
    message = "expected_model_fingerprint: this replica serves model fingerprint bbbb, not aaaa"
    other = make_error(message, status_from_message(message))
    fleet = Fleet(
        client,
        monkeypatch,
        r0=[[StreamChunk("Bon", 2, model_fingerprint="aaaa"), SpecDecConnectionError("Stream removed")]],
        r1=[other],
        r2=[other],
    )
    fleet.ready[0] = False
    delivered = []
    with pytest.raises(SpecDecResumeError, match="serves model fingerprint bbbb, not aaaa"):
        for chunk in client.stream("Hi"):
            delivered.append(chunk.text)
    assert delivered == ["Bon"] and [i for i, _ in fleet.sent] == [0, 1, 2]
