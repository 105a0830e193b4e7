"""What ``test_resume.py`` uses beside its tests: a stream cut on the client side (an error raised
between two chunks, as when the server goes), OpenAI-client requests and the endpoint's health and
resume count, SmolLM2's file with other weights, and a ``specdec-soak`` failover run.
"""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from served import (
    Server,
    wait_for,
)
from trispec.config import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG
from trispec_client import SpecDecClient, SpecDecConnectionError
from trispec_client.request import GenerationRequest
from trispec_client.soak import Report, Soak, build_parser, failover, settings_from

PROMPT = "Once upon a time, in a small village,"


def _text(chunks: Iterator[object]) -> str:
    return "".join(c.text for c in chunks)  # type: ignore[attr-defined]


def cut_on_the_client(
    monkeypatch: pytest.MonkeyPatch,
    after_chunks: int,
    change: Callable[[GenerationRequest], GenerationRequest] | None = None,
) -> list[GenerationRequest]:
    """The first request's stream breaks after ``after_chunks`` chunks, as one the server cut does;
    ``change`` alters what is sent again. Returns the requests sent, in order."""
    real = SpecDecClient._attempt
    sent: list[GenerationRequest] = []

    def attempt(
        self: SpecDecClient, request: GenerationRequest, timeout_s: float, replica: int = 0
    ) -> Iterator[object]:
        sent.append(request)
        if len(sent) == 1:
            return _broken(real(self, request, timeout_s, replica), after_chunks)
        return real(self, change(request) if change else request, timeout_s, replica)

    monkeypatch.setattr(SpecDecClient, "_attempt", attempt)
    return sent


def _broken(chunks: Iterator[object], after: int) -> Iterator[object]:
    try:
        for i, chunk in enumerate(chunks, start=1):
            yield chunk
            if i == after:
                raise SpecDecConnectionError("Stream removed (Socket closed)")
    finally:
        chunks.close()  # type: ignore[attr-defined]


# -- kill -9 of the stub, then of tritonserver, with streams in flight ----------------------------
OPENAI_REQUESTS = [  # (streamed, sampling): each sent once alone, then during each kill
    (True, {"temperature": 0.0, "extra_body": {"num_draft_tokens": 4}}),
    (True, {"temperature": 0.8, "seed": 21, "extra_body": {"num_draft_tokens": 0}}),
    (False, {"temperature": 0.0, "extra_body": {"num_draft_tokens": 0}}),
    (False, {"temperature": 0.8, "seed": 22, "extra_body": {"num_draft_tokens": 4}}),
]


def _openai(client: openai.OpenAI, streamed: bool, sampling: dict[str, object]) -> str:
    kw = {"model": "specdec", "prompt": PROMPT, "max_tokens": 64, **sampling}
    if not streamed:
        return client.completions.create(**kw).choices[0].text  # type: ignore[arg-type]
    return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)  # type: ignore[arg-type]


def _together(call: Callable[[int], str], n: int) -> list[str]:
    """``call(0)`` .. ``call(n - 1)`` at once (outputs do not depend on the batch: each is its text alone)."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(call, range(n)))


def _health(frontend: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"{frontend}/health", timeout=5) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as error:  # 503: no replica ready; the body says which
        return json.loads(error.read())


def _resumed_by(frontend: str) -> float:
    with urllib.request.urlopen(f"{frontend}/metrics", timeout=5) as resp:
        line = next(
            x for x in resp.read().decode().splitlines() if x.startswith("specdec_resumed_streams_total")
        )
    return float(line.rsplit(" ", 1)[1])


# -- a whole replica lost: the streams go on on another, or are refused if it serves another model --
def other_weights(tmp: Path) -> Path:
    """SmolLM2's GGUF with other weights: each layer's FFN norm weights permuted (a fixed seed), so
    the same architecture, tokenizer and speed, and other text."""
    from gguf import GGUFReader
    from trispec.checkpoints import resolve_checkpoint
    from trispec.config import load_config

    source = resolve_checkpoint(load_config(DEFAULT_CONFIG).target.checkpoint, "target.checkpoint")
    path = tmp / "other-weights.gguf"
    shutil.copyfile(source, path)
    rng = np.random.default_rng(7)
    norms = [t for t in GGUFReader(path, "r+").tensors if t.name.endswith("ffn_norm.weight")]
    assert norms
    for tensor in norms:
        tensor.data[:] = rng.permutation(np.asarray(tensor.data))
    return path


def _failover(
    server: Server, first: Server, endpoints: list[str], *extra: str
) -> tuple[Report, dict[str, object]]:
    """``specdec-soak --phases failover`` against ``first`` with the module's server as the second
    replica; two OpenAI requests (streamed, not) through ``endpoints`` beside its streams."""
    results: dict[str, object] = {}
    requests = [OPENAI_REQUESTS[1], OPENAI_REQUESTS[2]]  # sampled streamed, greedy whole

    def side(_: str) -> Callable[[], None]:
        def call(i: int) -> None:
            client = openai.OpenAI(
                base_url=f"{endpoints[i]}/v1", api_key="unused", timeout=120, max_retries=0
            )
            try:
                results[f"openai {i}"] = _openai(client, *requests[i])
            except Exception as exc:
                results[f"openai {i}"] = exc

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
        for thread in threads:
            thread.start()
        # both are running on the first replica before the soak's own streams start (it kills the
        # replica once those have their first tokens)
        wait_for(lambda: first.metric_or_zero("specdec_running_sequences") >= 2, 60, "the OpenAI requests")
        return lambda: [thread.join(120) for thread in threads] and None

    argv = ["--url", first.grpc, "--http-url", first.http, "--metrics-url", first.metrics]
    argv += ["--replica-url", server.grpc, "--replica-http-url", server.http]
    argv += ["--phases", "failover", "--fault-streams", "6", "--request-timeout-s", "120"]
    argv += ["--resume-timeout-s", "30", *extra]
    report = Report()
    failover.run(
        Soak(settings_from(build_parser().parse_args(argv), argv), report, lambda _: None), side=side
    )
    return report, results
