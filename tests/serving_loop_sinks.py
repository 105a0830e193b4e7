"""What the serving-loop tests (``test_serving_loop*.py``) share: sinks and metrics that record what
Triton's response sender and metric families would have been given, the offline text of a prompt,
and a loop served on a thread.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from tiny import model_drafter, run_to_completion, spec_engine, tiny_engine
from trispec.request import GenerationRequest
from trispec.serving.loop import RoundReport, ServingLoop
from trispec.serving.tensors import ParsedRequest

PROMPTS = ["héllo wörld", "speculative decoding", "a b c d e f", "zzz"]


class RecordingSink:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.responses: list[tuple[dict[str, np.ndarray], bool]] = []
        self.errors: list[str] = []
        self.error_kinds: list[str] = []
        self.done = threading.Event()
        self.cancel_after = cancel_after

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.responses) >= self.cancel_after

    def send(self, tensors: dict[str, np.ndarray], final: bool) -> None:
        assert not self.done.is_set(), "a response after the final one"
        self.responses.append((tensors, final))
        if final:
            self.done.set()

    def send_error(self, message: str, kind: str = "internal") -> None:
        self.errors.append(message)
        self.error_kinds.append(kind)
        self.done.set()

    @property
    def text(self) -> str:
        return "".join(t["text_output"][0].decode() for t, _ in self.responses)

    def texts_by_sequence(self) -> dict[tuple[int, int], str]:
        """Text per (batch_index, sequence_index)."""
        texts: dict[tuple[int, int], str] = {}
        for t, _ in self.responses:
            key = (int(t["batch_index"][0, 0]), int(t["sequence_index"][0, 0]))
            texts[key] = texts.get(key, "") + t["text_output"][0].decode()
        return texts

    @property
    def final(self) -> dict[str, np.ndarray]:
        tensors, final = self.responses[-1]
        assert final
        return tensors


class RecordingMetrics:
    def __init__(self) -> None:
        self.reports: list[RoundReport] = []
        self.rejections: list[str] = []

    def record(self, report: RoundReport) -> None:
        self.reports.append(report)

    def record_rejection(self, reason: str) -> None:
        self.rejections.append(reason)


def offline_texts(prompts: list[str], **kw: object) -> list[str]:
    llm = spec_engine(tiny_engine(0), model_drafter(1))
    ids = [llm.add_request(GenerationRequest(prompt=p, **kw)) for p in prompts]  # type: ignore[arg-type]
    outputs = run_to_completion(llm)
    return ["".join(o.new_text for o in outputs[i]) for i in ids]


@pytest.fixture
def served():
    target, draft = tiny_engine(0), model_drafter(1)
    metrics = RecordingMetrics()
    loop = ServingLoop(spec_engine(target, draft), metrics)
    loop.start()
    yield loop, target, draft, metrics
    loop.stop()


def submit(
    loop: ServingLoop, prompt: str, sink: RecordingSink, stream: bool = True, n: int = 1, **kw: object
) -> None:
    request = GenerationRequest(prompt=prompt, **kw)  # type: ignore[arg-type]
    loop.submit(
        ParsedRequest(request, stream=stream, exclude_input_in_output=False, num_return_sequences=n), sink
    )


def wait(*sinks: RecordingSink) -> None:
    for sink in sinks:
        assert sink.done.wait(60), "request did not finish"
