"""A full queue (``scheduler.max_waiting``) refuses a request for now: the model sends UNAVAILABLE, and
every client of it must be able to tell that it may retry.

Against a real server holding one running and one waiting request (``max_batch_size: 1``,
``max_waiting: 1``), four requests at once:
- Triton 2.51's HTTP ``generate`` and ``generate_stream`` answer the refusal with 400, not 503: they read
  the status from the model's error after freeing it (docs/serving-errors.md, "Retryable refusals over
  HTTP"). This test pins that, so that a Triton that says 503 shows up here and the docs get updated;
- ``SpecDecClient`` recognises the refusal over HTTP and gRPC (``SpecDecOverloadedError``, retryable)
  and retries it until the request runs;
- ``specdec-openai`` answers it 503 with ``Retry-After``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3
import yaml
from served import Server, openai_frontend, start_server, stop_server
from trispec.config import DEFAULT_CONFIG_PATH
from trispec_client import SpecDecClient, SpecDecError, SpecDecOverloadedError

pytestmark = [pytest.mark.server, pytest.mark.real_model]

CONCURRENT = 4
REFUSAL = "retry later"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("queue")
    config = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    config["scheduler"].update(max_batch_size=1, max_waiting=1)
    path = tmp / "queue.yaml"
    path.write_text(yaml.safe_dump(config))
    srv = start_server(tmp, "--config", str(path))
    yield srv
    stop_server(srv)


def at_once(task: Callable[[int], Any], count: int = CONCURRENT) -> list[Any]:
    """``task(i)`` on ``count`` threads released together; each one's result or exception."""
    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = task(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return results


# end_id -1: no end token, so each request runs its max_tokens and the queue stays full meanwhile
BODY = {"max_tokens": 32, "end_id": -1, "temperature": 0.0}


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_triton_says_400_for_a_full_queue_over_http(server: Server, endpoint: str) -> None:
    before = server.metric_or_zero("specdec_requests_rejected_total", reason="queue_full")
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=120), maxsize=CONCURRENT)
    url = f"http://{server.http}/v2/models/specdec/{endpoint}"

    def post(i: int) -> tuple[int, str]:
        body = {"text_input": f"Count to ten, take {i}:", **BODY, "stream": endpoint == "generate_stream"}
        reply = http.request("POST", url, json=body)
        return reply.status, reply.data.decode()

    replies = at_once(post)
    refused = [(status, text) for status, text in replies if REFUSAL in text]
    served = [status for status, text in replies if REFUSAL not in text]
    assert refused and served and set(served) == {200}, replies
    # the model sent UNAVAILABLE; if Triton ever answers 503 here, update docs/serving-errors.md
    assert {status for status, _ in refused} == {400}, refused
    after = server.metric("specdec_requests_rejected_total", reason="queue_full")
    assert after - before == len(refused)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_specdec_client_knows_a_full_queue_is_retryable_and_retries_it(server: Server, protocol: str) -> None:
    url = server.http if protocol == "http" else server.grpc

    def generate(retries: int) -> Callable[[int], str]:
        def run(i: int) -> str:
            with SpecDecClient(url, protocol=protocol, timeout_s=120, retries=retries) as client:  # type: ignore[arg-type]
                return client.generate(f"Count to ten, take {i}:", **BODY).text  # type: ignore[arg-type]

        return run

    # without retries the refusal reaches the caller, typed as retryable
    results = at_once(generate(0))
    refused = [r for r in results if isinstance(r, SpecDecError)]
    assert refused and all(isinstance(r, SpecDecOverloadedError) for r in refused), results
    assert all(r.retryable and r.status == "UNAVAILABLE" and REFUSAL in r.message for r in refused)
    if protocol == "http":
        assert {r.http_status for r in refused} == {400}
    # with them every request runs in the end, although the queue refused some on the way
    before = server.metric_or_zero("specdec_requests_rejected_total", reason="queue_full")
    results = at_once(generate(8))
    assert all(isinstance(r, str) and r for r in results), results
    assert server.metric("specdec_requests_rejected_total", reason="queue_full") > before


@pytest.fixture(scope="module")
def frontend(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with openai_frontend(server.grpc, tmp_path_factory.mktemp("openai") / "frontend.log") as url:
        yield url


def test_openai_endpoint_answers_503_with_retry_after(frontend: str) -> None:
    def complete(i: int) -> tuple[int, str | None, dict[str, Any]]:
        body = {"model": "specdec", "prompt": f"Count to ten, take {i}:", "max_tokens": 32, "temperature": 0}
        request = urllib.request.Request(
            f"{frontend}/v1/completions",
            json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                return reply.status, None, json.load(reply)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers.get("Retry-After"), json.loads(exc.read())

    replies = at_once(complete)
    refused = [r for r in replies if r[0] != 200]
    assert refused and len(refused) < CONCURRENT, replies
    for status, retry_after, body in refused:
        assert status == 503 and retry_after is not None, (status, retry_after, body)
        assert REFUSAL in body["error"]["message"], body
