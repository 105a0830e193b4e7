"""The serving loop with real tiny engines: streamed text equals the offline text, one-shot responses,
cancellation within a round, an engine failure or a failed send ending that request only, stopping,
and refusals (a full queue, a request waiting past max_queue_delay_s, too long prompts).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from serving_loop_sinks import PROMPTS, RecordingMetrics, RecordingSink, offline_texts, submit, wait
from tiny import FaultyEngine, model_drafter, spec_engine, tiny_engine
from trispec.errors import Overloaded
from trispec.request import GenerationRequest
from trispec.serving.loop import QueueLimits, ServingLoop
from trispec.serving.tensors import ParsedRequest


def test_streams_carry_exactly_the_offline_text(served) -> None:
    loop, target, draft, metrics = served
    sinks = [RecordingSink() for _ in PROMPTS]
    for i, (prompt, sink) in enumerate(zip(PROMPTS, sinks)):
        submit(loop, prompt, sink, max_tokens=24, num_draft_tokens=i % 3 * 2)
    wait(*sinks)
    assert [s.text for s in sinks] == offline_texts(PROMPTS, max_tokens=24)
    for sink in sinks:
        assert len(sink.responses) > 1  # streamed, not one response at the end
        assert [final for _, final in sink.responses].count(True) == 1
        assert sink.final["finish_reason"][0, 0] == b"length"
        assert sink.final["output_token_count"][0, 0] == 24
        assert "acceptance_rate" in sink.final
    assert metrics.reports[0].latency_s is None  # the idle report at start
    assert max(r.engine.max_verify_batch for r in metrics.reports) > 1
    assert target.kv_usage().used_blocks == 0 and draft.engine.kv_usage().used_blocks == 0


def test_one_shot_response_includes_the_prompt_unless_excluded(served) -> None:
    loop = served[0]
    whole, excluded = RecordingSink(), RecordingSink()
    loop.submit(ParsedRequest(GenerationRequest(prompt="abc", max_tokens=12), False, False), whole)
    loop.submit(ParsedRequest(GenerationRequest(prompt="abc", max_tokens=12), False, True), excluded)
    wait(whole, excluded)
    expected = offline_texts(["abc"], max_tokens=12)[0]
    assert len(whole.responses) == 1 and whole.text == "abc" + expected
    assert len(excluded.responses) == 1 and excluded.text == expected


def test_cancelled_request_ends_within_a_round_and_frees_its_blocks(served) -> None:
    loop, target, _, metrics = served
    cancelled, other = RecordingSink(cancel_after=2), RecordingSink()
    submit(loop, PROMPTS[0], cancelled, max_tokens=200, num_draft_tokens=2)
    submit(loop, PROMPTS[1], other, max_tokens=40, num_draft_tokens=2)
    wait(cancelled, other)
    assert cancelled.final["finish_reason"][0, 0] == b"cancelled"
    # the check runs before every round: at most one more round's text after the cancel
    assert len(cancelled.responses) <= 2 + 1 + 1
    assert cancelled.final["output_token_count"][0, 0] < 200
    assert other.text == offline_texts([PROMPTS[1]], max_tokens=40)[0]
    deadline = time.monotonic() + 10
    while loop.num_live() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert target.kv_usage().used_blocks == 0
    assert metrics.reports[-1].kv["target"].used_blocks == 0


def test_engine_failure_fails_that_request_only() -> None:
    target = tiny_engine(0)
    loop = ServingLoop(spec_engine(FaultyEngine(target, {1}), model_drafter(1)))  # type: ignore[arg-type]
    loop.start()
    try:
        sinks = [RecordingSink() for _ in range(3)]
        for prompt, sink in zip(PROMPTS, sinks):
            submit(loop, prompt, sink, max_tokens=16)
        wait(*sinks)
    finally:
        loop.stop()
    assert sinks[1].errors and "simulated device fault" in sinks[1].errors[0] and not sinks[1].responses
    expected = offline_texts([PROMPTS[0], PROMPTS[2]], max_tokens=16)
    assert [sinks[0].text, sinks[2].text] == expected
    assert not sinks[0].errors and not sinks[2].errors


class FailingSink(RecordingSink):
    """A response sender whose n-th send raises (a tensor Triton cannot take, a broken stub pipe)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.sends = 0

    def send(self, tensors: dict[str, np.ndarray], final: bool) -> None:
        self.sends += 1
        if self.sends == self.fail_at:
            raise RuntimeError("simulated send failure")
        super().send(tensors, final)


@pytest.mark.parametrize("fail_at", [1, 3])
def test_a_failed_send_still_ends_the_request_with_one_final_error(served, fail_at: int) -> None:
    """Without its final response a Triton request never completes: the gRPC stream it came on never
    closes and its client waits forever. So a send that fails is followed by an error response (which
    carries the final flag), and nothing after it."""
    loop = served[0]
    broken, other = FailingSink(fail_at), RecordingSink()
    submit(loop, PROMPTS[0], broken, max_tokens=24, num_draft_tokens=2)
    submit(loop, PROMPTS[1], other, max_tokens=24, num_draft_tokens=2)
    wait(broken, other)
    assert broken.errors == ["internal error: sending a response failed: simulated send failure"]
    assert not any(final for _, final in broken.responses) and len(broken.responses) == fail_at - 1
    assert other.text == offline_texts([PROMPTS[1]], max_tokens=24)[0]
    deadline = time.monotonic() + 10
    while loop.num_live() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.num_live() == 0 and broken.sends == fail_at  # dropped: nothing more was sent


def test_stop_ends_live_requests_with_an_error() -> None:
    loop = ServingLoop(spec_engine(tiny_engine(0), model_drafter(1)))
    loop.start()
    sink = RecordingSink()
    submit(loop, "long", sink, max_tokens=500)
    loop.stop()
    assert sink.done.is_set()
    assert sink.errors == ["the model is shutting down"] or sink.responses[-1][1]
    with pytest.raises(RuntimeError):
        submit(loop, "late", RecordingSink(), max_tokens=4)


def test_a_full_queue_refuses_at_once_and_counts_it() -> None:
    metrics = RecordingMetrics()
    loop = ServingLoop(spec_engine(tiny_engine(0), None), metrics, QueueLimits(max_waiting=2))
    sinks = [RecordingSink() for _ in range(3)]
    submit(loop, "a", sinks[0], max_tokens=4)
    submit(loop, "b", sinks[1], max_tokens=4)  # the loop is not started: both still wait
    with pytest.raises(Overloaded, match=r"scheduler\.max_waiting") as refused:
        submit(loop, "c", sinks[2], max_tokens=4)
    assert refused.value.reason == "queue_full" and loop.num_live() == 2
    loop.reject(refused.value.reason, "req-3", str(refused.value))
    assert metrics.rejections == ["queue_full"]


def test_a_request_waiting_past_max_queue_delay_is_refused_retryably() -> None:
    metrics = RecordingMetrics()
    engine = spec_engine(tiny_engine(0), None, max_batch_size=1)
    loop = ServingLoop(engine, metrics, QueueLimits(max_queue_delay_s=5.0))
    running, waiting, late = RecordingSink(), RecordingSink(), RecordingSink()
    submit(loop, "first", running, max_tokens=6)
    submit(loop, "second", waiting, max_tokens=6)
    for state in loop._live.values():
        state.submitted_at -= 10  # sent 10 s ago, but no step has run since (a long step, a loaded host)
    loop._expire_waiting()
    assert not waiting.done.is_set() and not running.done.is_set() and metrics.rejections == []
    engine.step()  # admits the first; the batch holds one
    submit(loop, "third", late, max_tokens=6)  # arrives during the step: no admission pass has seen it
    assert engine.queued_request_ids() == [1, 2] and engine.passed_over_request_ids() == [1]
    for state in loop._live.values():
        state.submitted_at -= 10  # all were sent 10 s ago: only the one a step passed over is refused
    loop._expire_waiting()
    assert waiting.done.is_set() and waiting.error_kinds == ["unavailable"]
    assert "scheduler.max_queue_delay_s" in waiting.errors[0]
    assert metrics.rejections == ["queue_timeout"] and not running.done.is_set() and not late.done.is_set()
    loop._live[2].submitted_at += 10  # sent now: it waits its turn behind the first and is served
    loop.start()
    try:
        wait(running, late)
    finally:
        loop.stop()
    assert running.final["finish_reason"][0, 0] == late.final["finish_reason"][0, 0] == b"length"
    assert engine.queued_request_ids() == []


def test_prompts_are_tokenised_on_the_loop_thread_and_too_long_ones_refused_from_there() -> None:
    metrics = RecordingMetrics()
    engine = spec_engine(tiny_engine(0), None, max_context=64)
    threads: list[str] = []
    encode = engine.scheduler.encode

    def recording_encode(text: str) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode(text)

    engine.scheduler.encode = recording_encode
    loop = ServingLoop(engine, metrics)
    too_long, fine = RecordingSink(), RecordingSink()
    submit(loop, "x" * 200, too_long, max_tokens=4)  # 200 byte tokens > 64: known only once tokenised
    submit(loop, "fine", fine, max_tokens=4)
    assert threads == []  # the submitting thread did not tokenise
    loop.start()
    try:
        wait(too_long, fine)
    finally:
        loop.stop()
    assert set(threads) == {"specdec-loop"}
    assert too_long.error_kinds == ["invalid"] and too_long.errors[0].startswith("text_input:")
    assert "longer than the context" in too_long.errors[0]
    assert metrics.rejections == ["too_long"]
    assert fine.final["finish_reason"][0, 0] == b"length"
