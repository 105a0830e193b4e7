"""KV on demand and preemption: a pool that holds fewer sequences than are running.

Sequences take KV blocks as they grow; when a step would run the pool dry the most recently
admitted sequence is preempted (blocks freed, queued first, recomputed from its verified tokens).
What must hold through it: every output equals the same request run alone (greedy and seeded
sampling), no token is emitted twice, every block returns, and a preempted request is never
refused as "waited too long" (it already streams).
"""

from __future__ import annotations

import pytest
from tiny import model_drafter, reference_greedy, run_to_completion, spec_engine, tiny_engine, tokens_of
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest

PROMPTS = [[(7 * i + 3 * j) % 200 + 20 for j in range(5 + 3 * i)] for i in range(6)]
MAX_TOKENS = 40


def small_pool(num_draft_tokens_max: int = 8, draft_blocks: int | None = 10) -> LLMEngine:
    """Target pool of 12 blocks of 8 (96 tokens) for six sequences of up to 60 tokens each."""
    drafter = model_drafter(5, num_blocks=draft_blocks, block_size=8) if draft_blocks else None
    return spec_engine(
        tiny_engine(0, num_blocks=12, block_size=8),
        drafter,
        max_context=96,
        max_num_draft_tokens=num_draft_tokens_max,
    )


def requests(k: int, **sampling: float) -> list[GenerationRequest]:
    return [
        GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=k, **sampling)  # type: ignore[arg-type]
        for p in PROMPTS
    ]


def run_all(llm: LLMEngine, reqs: list[GenerationRequest]) -> list[list[int]]:
    ids = [llm.add_request(r) for r in reqs]
    outputs = run_to_completion(llm)
    for i in ids:
        assert [o.finished for o in outputs[i]].count(True) == 1 and outputs[i][-1].finished
    return [tokens_of(outputs[i]) for i in ids]


def assert_idle(llm: LLMEngine) -> None:
    assert all(pool.used_blocks == 0 for pool in llm.kv_usage().values())
    assert llm.num_running == 0 and llm.num_waiting == 0


@pytest.mark.parametrize(
    ("k", "draft_blocks"), [(4, 10), (8, 10), (0, 10), (0, None)], ids=["k4", "k8", "k0", "no-drafter"]
)
def test_greedy_outputs_equal_solo_through_preemption(k: int, draft_blocks: int | None) -> None:
    llm = small_pool(draft_blocks=draft_blocks)
    outputs = run_all(llm, requests(k))
    assert llm.stats.preemptions > 0, "the pool was meant to force preemption"
    for prompt, out in zip(PROMPTS, outputs):
        # exactly the target-only greedy tokens: nothing repeated, nothing lost
        assert out == reference_greedy(prompt, MAX_TOKENS)
    assert_idle(llm)


def test_seeded_sampling_equals_solo_through_preemption() -> None:
    sampling = {"temperature": 0.8, "seed": 11}
    llm = small_pool()
    outputs = run_all(llm, requests(4, **sampling))
    assert llm.stats.preemptions > 0
    for req, out in zip(requests(4, **sampling), outputs):
        assert out == run_all(small_pool(), [req])[0]  # the same config, alone
    assert_idle(llm)


def test_preempted_requests_resume_first_and_are_not_queued_as_new() -> None:
    llm = small_pool()
    ids = [llm.add_request(r) for r in requests(4)]
    seen_preempted = False
    while llm.has_work():
        llm.step()
        preempted = [s.seq_id for s in llm.scheduler.waiting if s.preemptions]
        if preempted:
            seen_preempted = True
            # they wait first in line, ahead of requests never started ...
            first = list(llm.scheduler.waiting)[: len(preempted)]
            assert [s.seq_id for s in first] == preempted
            # ... and are not "queued" (a queue-delay limit never refuses a request already streaming)
            assert not set(preempted) & set(llm.queued_request_ids())
    assert seen_preempted and set(ids)
    assert_idle(llm)


def test_cancelling_a_preempted_request_releases_it() -> None:
    llm = small_pool()
    [llm.add_request(r) for r in requests(4)]
    while not any(s.preemptions for s in llm.scheduler.waiting):
        llm.step()
    victim = next(s for s in llm.scheduler.waiting if s.preemptions)
    llm.cancel(victim.seq_id)
    outputs = run_to_completion(llm)
    assert outputs[victim.seq_id][-1].finish_reason is not None
    assert victim.seq_id not in llm.runner._generators  # type: ignore[attr-defined]
    assert_idle(llm)


def test_a_small_draft_pool_drafts_less_and_stays_exact() -> None:
    # the draft model's pool holds one sequence: the others decode plain rounds instead of waiting
    llm = small_pool(draft_blocks=6)
    outputs = run_all(llm, requests(4))
    for prompt, out in zip(PROMPTS, outputs):
        assert out == reference_greedy(prompt, MAX_TOKENS)
    stats = llm.stats
    # some rounds planned with drafts drafted nothing (no room), others drafted
    assert 0 < stats.drafts < sum(stats.rounds_by_num_draft_tokens[1:])
    assert_idle(llm)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_request_waiting_too_long_takes_the_place_of_one_that_streamed_as_long() -> None:
    # serving under overload: the batch is full (two slots); the third request, once it has waited
    # half of max_queue_delay_s, preempts the most recently admitted sequence that streamed as long
    llm = spec_engine(tiny_engine(0, num_blocks=64, block_size=8), None, max_context=96, max_batch_size=2)
    clock = Clock()
    llm.scheduler.clock = clock
    llm.admit_urgently_after(1.0)
    ids = [llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS)) for p in PROMPTS[:3]]
    outputs: dict[int, list] = {}

    def step() -> None:
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)

    for _ in range(3):
        step()
    assert ids[2] not in outputs and llm.num_waiting == 1  # waits while it is not urgent
    clock.now = 0.9
    step()
    assert ids[2] not in outputs
    clock.now = 1.0
    step()  # urgent now: admitted in place of the newest sequence, and its first token comes at once
    assert tokens_of(outputs[ids[2]]) and llm.stats.preemptions == 1
    assert [s.seq_id for s in llm.scheduler.waiting] == [ids[1]]
    while llm.has_work():
        step()
    for prompt, i in zip(PROMPTS, ids):
        assert tokens_of(outputs[i]) == reference_greedy(prompt, MAX_TOKENS)
    assert_idle(llm)


def test_offline_requests_wait_their_turn() -> None:
    llm = spec_engine(tiny_engine(0, num_blocks=64, block_size=8), None, max_context=96, max_batch_size=2)
    clock = Clock()
    llm.scheduler.clock = clock
    ids = [llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS)) for p in PROMPTS[:3]]
    llm.step()
    clock.now = 100.0
    outputs = run_to_completion(llm)
    assert llm.stats.preemptions == 0 and all(tokens_of(outputs[i]) for i in ids)


def test_churn_of_arrivals_cancels_preemption_and_urgent_admission_stays_exact() -> None:
    """Randomised: requests arrive, wait, get cancelled, preempted and admitted urgently in a pool that
    is always short; most begin with one of a few prefixes, so the prefix cache shares, evicts and
    copies blocks in both pools all along. Nothing fails, every request ends once, greedy ones equal
    their target-only output, and every block comes back (the books balance)."""
    import random

    rng = random.Random(7)
    prefixes = [[rng.randrange(20, 200) for _ in range(n)] for n in (9, 17, 30)] + [[]]
    target, drafter = (
        tiny_engine(0, num_blocks=24, block_size=8),
        model_drafter(5, num_blocks=16, block_size=8),
    )
    llm = spec_engine(
        target,
        drafter,
        max_context=96,
        max_batch_size=6,
        max_prefill_tokens_per_step=24,
        adaptive_speculation=True,
    )
    clock = Clock()
    llm.scheduler.clock = clock
    llm.admit_urgently_after(0.5)
    greedy: dict[int, GenerationRequest] = {}
    cancelled: set[int] = set()
    outputs: dict[int, list] = {}
    for step in range(400):
        if step < 300 and rng.random() < 0.3:
            prompt = rng.choice(prefixes) + [rng.randrange(20, 200) for _ in range(rng.randint(2, 10))]
            sampled = rng.random() < 0.4
            request = GenerationRequest(
                prompt_token_ids=prompt,
                max_tokens=rng.randint(1, 96 - len(prompt)),
                num_draft_tokens=rng.choice([0, 2, 4, 8]),
                temperature=0.8 if sampled else 0.0,
                seed=rng.randrange(100) if sampled else None,
            )
            rid = llm.add_request(request, tokenize_later=rng.random() < 0.5)
            if not sampled:
                greedy[rid] = request
        live = [r for r in greedy if r not in outputs or not outputs[r][-1].finished]
        if live and rng.random() < 0.03:
            victim = rng.choice(live)
            llm.cancel(victim)
            cancelled.add(victim)
        clock.now += rng.random() * 0.2
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    for out_id, outs in run_to_completion(llm).items():
        outputs.setdefault(out_id, []).extend(outs)
    assert llm.stats.preemptions > 20
    assert all(o.error is None for outs in outputs.values() for o in outs)
    assert all([o.finished for o in outs].count(True) == 1 and outs[-1].finished for outs in outputs.values())
    for rid, request in greedy.items():
        if rid not in cancelled:
            expected = reference_greedy(list(request.prompt_token_ids or []), request.max_tokens)
            assert tokens_of(outputs[rid]) == expected, rid
    assert_idle(llm)
    assert llm.stats.cached_prompt_tokens > 500  # (adaptive k drafts little here: the draft pool idles)
    target.blocks.check()
    drafter.engine.blocks.check()
