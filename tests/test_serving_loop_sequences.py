"""The serving loop with real tiny engines, several sequences per request and what responses carry:
num_return_sequences and the rows of a batch share one sender, cancelling or failing one ends
them all; log-probs, counts, per-sequence reports; a resumed stream sends only the text after the
skipped tokens; a sampled sequence says its seed once.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from serving_loop_sinks import PROMPTS, RecordingMetrics, RecordingSink, offline_texts, submit, wait
from tiny import FaultyEngine, model_drafter, spec_engine, tiny_engine
from trispec.errors import Overloaded
from trispec.request import GenerationRequest
from trispec.serving.loop import QueueLimits, ServingLoop
from trispec.serving.tensors import ParsedRequest


@pytest.mark.parametrize("stream", [True, False])
def test_num_return_sequences_share_one_sender_and_end_with_one_final_flag(served, stream: bool) -> None:
    loop = served[0]
    sink = RecordingSink()
    submit(loop, "abc", sink, stream=stream, n=3, max_tokens=10, temperature=1.0, seed=7)
    wait(sink)
    # each sequence as if sent alone with seed + i; only the last response closes the request
    expected = [offline_texts(["abc"], max_tokens=10, temperature=1.0, seed=7 + i)[0] for i in range(3)]
    prefix = "" if stream else "abc"
    assert sink.texts_by_sequence() == {(0, i): prefix + text for i, text in enumerate(expected)}
    assert [final for _, final in sink.responses] == [False] * (len(sink.responses) - 1) + [True]
    finals = [t for t, _ in sink.responses if "finish_reason" in t]
    assert sorted(int(t["sequence_index"][0, 0]) for t in finals) == [0, 1, 2]
    if not stream:
        assert len(sink.responses) == 3


def test_rows_of_a_batch_fan_out_with_their_batch_index(served) -> None:
    loop = served[0]
    sink = RecordingSink()
    rows = [ParsedRequest(GenerationRequest(prompt=p, max_tokens=8), False, True) for p in PROMPTS[:2]]
    loop.submit(rows, sink)
    wait(sink)
    expected = offline_texts(PROMPTS[:2], max_tokens=8)
    assert sink.texts_by_sequence() == {(0, 0): expected[0], (1, 0): expected[1]}


def test_cancelling_the_sender_cancels_every_sequence(served) -> None:
    loop, target, _, _ = served
    sink = RecordingSink(cancel_after=2)
    submit(loop, PROMPTS[0], sink, n=3, max_tokens=300, num_draft_tokens=2)
    wait(sink)
    finals = [t for t, _ in sink.responses if "finish_reason" in t]
    assert sorted(int(t["sequence_index"][0, 0]) for t in finals) == [0, 1, 2]
    assert {t["finish_reason"][0, 0] for t in finals} == {b"cancelled"}
    deadline = time.monotonic() + 10
    while loop.num_live() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert target.kv_usage().used_blocks == 0


def test_one_failing_sequence_ends_the_whole_request_with_one_error() -> None:
    target = tiny_engine(0)
    loop = ServingLoop(spec_engine(FaultyEngine(target, {1}), model_drafter(1)))  # type: ignore[arg-type]
    loop.start()
    try:
        sink = RecordingSink()
        submit(loop, PROMPTS[0], sink, n=3, max_tokens=16)
        wait(sink)
        deadline = time.monotonic() + 10
        while loop.num_live() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
    assert len(sink.errors) == 1 and "simulated device fault" in sink.errors[0]
    assert not any(final for _, final in sink.responses)
    assert target.kv_usage().used_blocks == 0


def test_a_request_too_big_for_the_queue_is_refused_whole() -> None:
    loop = ServingLoop(spec_engine(tiny_engine(0), None), None, QueueLimits(max_waiting=4))
    submit(loop, "a", RecordingSink(), n=2, max_tokens=4)
    with pytest.raises(Overloaded, match="brings 3"):
        submit(loop, "b", RecordingSink(), n=3, max_tokens=4)
    assert loop.num_live() == 2


def test_log_probs_counts_and_perf_metrics_come_with_the_responses(served) -> None:
    loop = served[0]
    streamed, whole = RecordingSink(), RecordingSink()
    for sink, stream in ((streamed, True), (whole, False)):
        request = GenerationRequest(prompt="abc", max_tokens=12, return_log_probs=True)
        loop.submit(ParsedRequest(request, stream, False, 1, True, True, True), sink)
    before = time.time_ns()
    wait(streamed, whole)
    for sink in (streamed, whole):
        log_probs = [lp for t, _ in sink.responses for lp in t["output_log_probs"].reshape(-1)]
        counts = [int(t["num_output_tokens"][0, 0]) for t, _ in sink.responses]
        assert len(log_probs) == sum(counts) == 12 and all(lp <= 0 for lp in log_probs)
        final = sink.final
        assert final["cum_log_probs"][0, 0] == pytest.approx(sum(log_probs), rel=1e-4)
        assert final["num_input_tokens"][0, 0] == 3  # the tiny byte tokenizer: one token a byte
        times = [final[n][0, 0] for n in ("arrival_time_ns", "first_scheduled_time_ns")]
        times += [final[n][0, 0] for n in ("first_token_time_ns", "last_token_time_ns")]
        assert times == sorted(times) and times[0] > before - 60 * 10**9
        # the 3-token prompt's one block in the target's pool: too short to be cached, so missed
        # and taken from the pool (TensorRT-LLM's kv_cache_metrics)
        kv = {
            n: final[f"kv_cache_{n}"][0, 0] for n in ("alloc_total_blocks", "missed_blocks", "reused_blocks")
        }
        assert kv == {"alloc_total_blocks": 1, "missed_blocks": 1, "reused_blocks": 0}
        assert final["kv_cache_hit_rate"][0, 0] == 0 and final["cached_tokens"][0, 0] == 0
        assert all("arrival_time_ns" in t and "total_draft_tokens" in t for t, _ in sink.responses)
    assert len(whole.responses) == 1


def test_reports_carry_each_sequences_first_token_and_inter_token_latency(served) -> None:
    loop, _, _, metrics = served
    sinks = [RecordingSink() for _ in range(3)]
    started = time.monotonic()
    for prompt, sink in zip(PROMPTS, sinks):
        submit(loop, prompt, sink, max_tokens=12, num_draft_tokens=2)
    one = RecordingSink()
    submit(loop, PROMPTS[3], one, max_tokens=1)
    wait(*sinks, one)
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + 10
    while sum(len(r.finished) for r in metrics.reports) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    ttft = [s for r in metrics.reports for s in r.ttft_s]
    inter_token = [s for r in metrics.reports for s in r.inter_token_s]
    assert len(ttft) == 4 and all(0 < s <= elapsed for s in ttft)
    assert len(inter_token) == 3 and all(0 <= s <= elapsed / 11 for s in inter_token)  # not the 1-token one


class ResumeMetrics(RecordingMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.resumed = 0

    def record_resumed(self) -> None:
        self.resumed += 1


def test_a_resumed_stream_sends_only_the_text_after_the_skipped_tokens_and_confirms_them() -> None:
    """skip_output_tokens N (a stream resumed after the server cut it): every token is generated again,
    only the text after the first N is sent, and the first response carries the SHA-256 of the text
    of those N, which is the text a client streaming the same request had at N. Checked at every
    response of a plain-decoding stream (one token per round), resumed with k=4 and a drafter with
    the target's weights (every draft accepted: five tokens a round), so that N falls inside a
    round; log-probs and num_output_tokens cover the sent tokens, cum_log_probs all."""
    import hashlib

    metrics = ResumeMetrics()
    loop = ServingLoop(spec_engine(tiny_engine(0), model_drafter(0)), metrics)
    loop.start()
    try:
        kw = {"max_tokens": 24, "return_log_probs": True}
        whole = RecordingSink()
        submit(loop, PROMPTS[0], whole, num_draft_tokens=0, **kw)
        wait(whole)
        boundaries, text = [], ""
        for tensors, final in whole.responses:
            text += tensors["text_output"][0].decode()
            if not final:
                boundaries.append((int(tensors["output_token_count"][0, 0]), text))
        assert len(boundaries) >= 5
        for count, delivered in boundaries:
            sink = RecordingSink()
            request = GenerationRequest(prompt=PROMPTS[0], num_draft_tokens=4, skip_output_tokens=count, **kw)
            loop.submit(
                ParsedRequest(request, stream=True, exclude_input_in_output=False, resumed=True), sink
            )
            wait(sink)
            first = sink.responses[0][0]
            assert (
                first["skipped_text_sha256"][0, 0].decode() == hashlib.sha256(delivered.encode()).hexdigest()
            )
            assert all("skipped_text_sha256" not in t for t, _ in sink.responses[1:])
            assert delivered + sink.text == whole.text, count
            assert sink.final["output_token_count"][0, 0] == 24
            assert sink.final["accepted_tokens"][0, 0] > 0  # rounds of several tokens
            sent = sum(t["output_log_probs"].size for t, _ in sink.responses)
            assert sent == 24 - count
            assert sink.final["cum_log_probs"][0, 0] == pytest.approx(whole.final["cum_log_probs"][0, 0])
        assert metrics.resumed == len(boundaries)
    finally:
        loop.stop()


def test_a_sampled_sequence_says_its_seed_on_its_first_response_only(served) -> None:
    loop = served[0]
    sampled, greedy = RecordingSink(), RecordingSink()
    submit(loop, PROMPTS[1], sampled, max_tokens=16, temperature=0.8, seed=2**63 + 7, num_draft_tokens=2)
    submit(loop, PROMPTS[1], greedy, max_tokens=16, num_draft_tokens=2)
    wait(sampled, greedy)
    seeds = [t.get("sampling_seed") for t, _ in sampled.responses]
    assert seeds[0] is not None and seeds[0].dtype == np.uint64 and seeds[0][0, 0] == 2**63 + 7
    assert len(seeds) > 1 and all(s is None for s in seeds[1:])
    assert all("sampling_seed" not in t for t, _ in greedy.responses)


def test_a_repeated_prompt_reports_its_cached_tokens_and_reused_blocks(served) -> None:
    """The second request of one prompt takes its blocks from the prefix cache: the final response
    says how many prompt tokens (``cached_tokens``), and with perf metrics TensorRT-LLM's per-request
    block counts; the text is the first request's."""
    loop = served[0]
    prompt = "A conversation so far, long enough to fill a few blocks of the target's pool."
    sinks = []
    for _ in range(2):
        sink = RecordingSink()
        request = GenerationRequest(prompt=prompt, max_tokens=6)
        loop.submit(ParsedRequest(request, True, False, 1, True), sink)
        wait(sink)
        sinks.append(sink)
    cold, warm = (s.final for s in sinks)
    assert sinks[0].text == sinks[1].text
    assert cold["cached_tokens"][0, 0] == 0 and cold["kv_cache_reused_blocks"][0, 0] == 0
    assert warm["cached_tokens"][0, 0] == len(prompt) - 1  # every prompt token but the last
    reused, missed = warm["kv_cache_reused_blocks"][0, 0], warm["kv_cache_missed_blocks"][0, 0]
    assert reused > 0 and missed == 0 and warm["kv_cache_hit_rate"][0, 0] == 1.0


def test_alternatives_come_beside_each_responses_log_probs(served) -> None:
    loop = served[0]
    streamed, whole = RecordingSink(), RecordingSink()
    for sink, stream in ((streamed, True), (whole, False)):
        request = GenerationRequest(prompt="abc", max_tokens=10, return_log_probs=True, top_log_probs=3)
        loop.submit(ParsedRequest(request, stream, False, 1, False, False, True), sink)
    wait(streamed, whole)
    rows = {}
    for name, sink in (("streamed", streamed), ("whole", whole)):
        ids = np.concatenate([t["output_top_token_ids"] for t, _ in sink.responses], axis=2)
        values = np.concatenate([t["output_top_log_probs"] for t, _ in sink.responses], axis=2)
        log_probs = np.concatenate([t["output_log_probs"] for t, _ in sink.responses], axis=2)
        assert ids.shape == values.shape == (1, 1, 10, 3) and ids.dtype == np.int32
        # greedy: each emitted token is its row's most likely one, its log-prob the first alternative's
        assert np.array_equal(values[0, 0, :, 0], log_probs[0, 0])
        assert (np.diff(values[0, 0], axis=1) <= 0).all() and (ids >= 0).all()
        rows[name] = (ids, values)
    assert all(np.array_equal(a, b) for a, b in zip(rows["streamed"], rows["whole"]))


def test_the_prompts_log_probs_come_once_with_the_first_response(served) -> None:
    loop = served[0]
    streamed, whole = RecordingSink(), RecordingSink()
    for sink, stream in ((streamed, True), (whole, False)):
        request = GenerationRequest(
            prompt="abcd", max_tokens=6, return_log_probs=True, top_log_probs=2, prompt_log_probs=True
        )
        loop.submit(ParsedRequest(request, stream, False, 1, False, False, False), sink)
    wait(streamed, whole)
    firsts = []
    for sink in (streamed, whole):
        carrying = [t for t, _ in sink.responses if "prompt_log_probs" in t]
        assert len(carrying) == 1 and carrying[0] is sink.responses[0][0]
        first = carrying[0]
        # the byte tokenizer: 4 prompt tokens, 3 of them after the first
        assert first["prompt_log_probs"].shape == (1, 3) and (first["prompt_log_probs"] < 0).all()
        assert first["prompt_top_token_ids"].shape == first["prompt_top_log_probs"].shape == (1, 3, 2)
        firsts.append(first["prompt_log_probs"])
    assert np.array_equal(*firsts)
