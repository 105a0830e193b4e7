"""An operator's reset of the prefix cache, below the server: the books (``BlockManager``) empty the
cache and leave running sequences whole; the serving loop runs it on its own thread between two steps
and answers once, both pools emptied, a running stream's text unchanged; who may ask (the admin key).
The same through the real server: ``test_server_prefix_reset.py``."""

from __future__ import annotations

import json
import threading

import pytest
from serving_loop_sinks import RecordingMetrics, RecordingSink, offline_texts, submit, wait
from tiny import model_drafter, spec_engine, tiny_engine
from trispec.engine.block_manager import BlockManager
from trispec.errors import InvalidInputError
from trispec.serving.admin import admin_key_of, authorize, check_reset_alone
from trispec.serving.loop import ServingLoop
from trispec.serving.triton_command import OPEN_ADMIN, admin_key_digest

BS = 4


def sealed(bm: BlockManager, seq_id: int, tokens: list[int]) -> int:
    """A request as the runner makes one: registered, matched, the rest appended, all sealed."""
    bm.add(seq_id, 1000)
    hit = bm.match(seq_id, tokens).length
    bm.append(seq_id, len(tokens) - hit)
    bm.seal(seq_id, tokens)
    return hit


def test_a_reset_empties_the_cache_and_leaves_running_sequences_whole() -> None:
    bm = BlockManager(32, BS)
    done, running = list(range(10)), list(range(100, 112))  # 2 full blocks + 2; 3 full blocks
    sealed(bm, 0, done)
    bm.free(0)  # cached: 2 full blocks and its partly filled third
    assert sealed(bm, 1, running) == 0
    bm.add(2, 1000)
    assert bm.match(2, running[:9]).length == 8  # a second running sequence shares two of its blocks
    bm.append(2, 1)
    table = list(bm.block_table(1))
    assert (bm.cached_blocks, bm.used_blocks) == (3, 4)

    reset = bm.reset_prefix_cache()

    assert (reset.emptied_blocks, reset.held_blocks) == (3, 3)
    assert (bm.cached_blocks, bm.used_blocks, bm.empty_blocks) == (0, 4, 28)
    assert bm.probe(done) == (0, 0) and bm.probe(running) == (0, 0)  # nothing found any more
    bm.check()
    # the running ones go on: their blocks and lengths unchanged, they grow, roll back and end
    assert bm.block_table(1) == table and bm.length(1) == 12
    bm.append(1, 5)
    bm.seal(1, [*running, 7, 7, 7, 7])  # a fourth full block, verified after the reset
    bm.truncate(1, 16)
    bm.append(2, 3)
    bm.truncate(2, 9)
    bm.check()
    bm.free(2)
    bm.free(1)
    bm.check()
    # what they held before the reset went back empty: a new request computes their prompt again
    assert sealed(bm, 3, running) == 0
    assert sealed(bm, 4, done) == 0
    bm.check()


def test_the_forwarded_key_is_found_in_any_case_and_a_reset_comes_alone() -> None:
    key, rest = admin_key_of(
        json.dumps({"Specdec-Admin-Key": "k", "triton_enable_empty_final_response": True})
    )
    assert (key, json.loads(rest)) == ("k", {"triton_enable_empty_final_response": True})
    assert admin_key_of('{"specdec-admin-key": "k", "max_tokens": 3}') == ("k", '{"max_tokens": 3}')
    assert admin_key_of("") == (None, "{}")
    check_reset_alone(["reset_prefix_cache"])
    with pytest.raises(
        InvalidInputError, match="reset_prefix_cache: a reset takes no other input, got text_input"
    ):
        check_reset_alone(["reset_prefix_cache", "text_input"])


def test_only_the_admin_key_resets_unless_the_admin_apis_are_open() -> None:
    digest = admin_key_digest("s3cret")
    authorize("s3cret", digest)
    authorize(None, OPEN_ADMIN)
    authorize("anything", OPEN_ADMIN)
    refusals = [("x", digest, "not this server's admin key"), (None, digest, "needs the admin key")]
    refusals.append(("s3cret", None, "not started by specdec-serve"))  # nothing to check it against
    for key, given, message in refusals:
        with pytest.raises(InvalidInputError, match=message) as refused:
            authorize(key, given)
        assert str(refused.value).startswith("specdec-admin-key: ") and refused.value.reason == "admin_key"


class ResetMetrics(RecordingMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.reset_at: list[int] = []  # how many reports there were at each reset

    def record_prefix_cache_reset(self) -> None:
        self.reset_at.append(len(self.reports))


def test_the_loop_resets_between_steps_on_its_thread_and_running_streams_keep_their_text() -> None:
    target, draft = tiny_engine(0), model_drafter(1)
    engine = spec_engine(target, draft)
    prompt = "speculative decoding " * 3
    hits, running, answered = RecordingSink(), RecordingSink(), RecordingSink()
    stepping, parked, resume = threading.Event(), threading.Event(), threading.Event()
    seen: list[tuple[str, bool]] = []
    step, reset = engine.step, engine.reset_prefix_cache

    def step_marked() -> list:  # type: ignore[type-arg]
        if running.responses and not resume.is_set():  # the running stream has begun: hold here
            parked.set()
            resume.wait()
        stepping.set()
        try:
            return step()
        finally:
            stepping.clear()

    def reset_seen() -> dict:  # type: ignore[type-arg]
        seen.append((threading.current_thread().name, stepping.is_set()))
        return reset()

    engine.step, engine.reset_prefix_cache = step_marked, reset_seen  # type: ignore[method-assign]
    metrics = ResetMetrics()
    loop = ServingLoop(engine, metrics)
    loop.start()
    try:
        for sink in (RecordingSink(), hits):
            submit(loop, prompt, sink, max_tokens=16, num_draft_tokens=2)
            wait(sink)
        assert hits.final["cached_tokens"][0, 0] > 0  # the second time, its prompt was cached
        submit(loop, prompt + "and more", running, max_tokens=200, num_draft_tokens=3)
        assert parked.wait(60)  # decoding, its blocks held, the loop between two steps
        loop.reset_prefix_cache(answered)
        resume.set()
        wait(answered, running)
        report = json.loads(answered.final["text_output"][0])
        assert seen == [("specdec-loop", False)]  # the loop's thread, between two steps
        assert set(report["pools"]) == {"target", "drafter"}
        assert all(pool["emptied_blocks"] > 0 for pool in report["pools"].values()), report
        assert all(pool["held_blocks"] > 0 for pool in report["pools"].values()), report
        assert running.text == offline_texts([prompt + "and more"], max_tokens=200)[0]
        assert len(metrics.reset_at) == 1  # counted, and the pools' gauges reported at once
        after = metrics.reports[metrics.reset_at[0]]
        assert after.kv["target"].cached_blocks == after.kv["drafter"].cached_blocks == 0
        again = RecordingSink()
        submit(loop, prompt, again, max_tokens=16, num_draft_tokens=2)
        wait(again)
        assert again.final["cached_tokens"][0, 0] == 0 and again.text == hits.text
    finally:
        resume.set()
        loop.stop()
    assert target.kv_usage().used_blocks == 0 and draft.engine.kv_usage().used_blocks == 0
    target.blocks.check()
    draft.engine.blocks.check()


def test_a_runner_that_cannot_reset_refuses_saying_why() -> None:
    """The TensorRT-LLM runner: its executors' reuse cache is not ours to empty; the model answers
    INVALID_ARG naming the request's input and the reason, and nothing else happens."""
    from trispec.runners.trtllm_runner import TrtllmSpecRunner
    from trispec.serving.admin import run_reset

    class Engine:
        def reset_prefix_cache(self) -> dict:  # type: ignore[type-arg]
            return TrtllmSpecRunner.reset_prefix_cache(None)  # type: ignore[arg-type]

    message, kind = run_reset(Engine())  # type: ignore[arg-type, misc]
    assert kind == "invalid" and message.startswith("reset_prefix_cache: the TensorRT-LLM runner"), message
