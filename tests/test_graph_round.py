"""The CUDA-graph round (runners/graph_round.py) with ``capture=False``: the same static buffers and
step functions run eagerly on CPU. Greedy output equals target-only decoding with the graph path
taken; one round's drafts, tokens and caches equal the eager round's; padding, trash slots and
block-table rows are staged from the block managers every round; which rounds stay eager."""

from __future__ import annotations

import pytest
import torch
from tiny import (
    byte_tokenizer,
    reference_greedy,
    repeating_prompts,
    run_to_completion,
    tiny_engine,
    tokens_of,
)
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import DraftRequest
from trispec.drafters.model_drafter import ModelDrafter
from trispec.engine.base import ForwardInput
from trispec.engine.gpu.cuda_graphs import SeqRows, StepGraphs
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.graph_plan import GraphPlan
from trispec.runners.graph_round import GraphRound, graph_round_for
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.sampling.graph_sampler import SamplerMode
from trispec.sampling_params import SamplingParams
from trispec.scheduler import Scheduler
from trispec.step import SeqStep

MAX_CONTEXT = 128
SIZES = (1, 2, 4, 8)


def drafter_of(kind: str, target) -> ModelDrafter:
    if kind == "self":  # bf16 copy of the target that takes the target's keys and values
        return ModelDrafter(tiny_engine(0, dtype="bfloat16", max_context=MAX_CONTEXT), kv_source=target)
    return ModelDrafter(tiny_engine(7, max_context=MAX_CONTEXT))


def graph_llm(kind: str, max_k: int = 4, **config: object) -> tuple[LLMEngine, GraphRound, list[int]]:
    """An LLMEngine whose runner takes the graph path when it can; the list counts graph rounds."""
    target = tiny_engine(0, max_context=MAX_CONTEXT)
    drafter = drafter_of(kind, target)
    graphs = GraphRound(target, drafter, max_k=max_k, sizes=SIZES, capture=False)
    rounds: list[int] = []
    run = graphs.run

    def counted(steps, plan, rollback):
        rounds.append(len(steps))
        return run(steps, plan, rollback)

    graphs.run = counted  # type: ignore[method-assign]
    runner = TorchSpecRunner(target, drafter, graphs)
    tokenizer = byte_tokenizer()
    config.setdefault("adaptive_speculation", False)
    scheduler = Scheduler(
        runner,
        SchedulerConfig(max_num_draft_tokens=max_k, **config),
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=tokenizer.eos_ids,
    )
    return LLMEngine(scheduler, runner), graphs, rounds


@pytest.mark.parametrize("kind", ["model", "self"])
def test_graph_path_output_equals_target_greedy(kind: str) -> None:
    prompts = repeating_prompts(6, seed=3)
    references = [reference_greedy(p, 24) for p in prompts]
    # a small prefill budget: prompt chunks ride along in some steps (fed eagerly, then the graphs)
    llm, graphs, rounds = graph_llm(kind, max_prefill_tokens_per_step=12)
    ids = [
        llm.add_request(
            GenerationRequest(prompt_token_ids=p, max_tokens=24, num_draft_tokens=[0, 2, 4][i % 3])
        )
        for i, p in enumerate(prompts)
    ]
    outputs = run_to_completion(llm)
    assert [tokens_of(outputs[rid]) for rid in ids] == references
    assert len(rounds) > 5 and max(rounds) > 1  # the graph path ran, batched
    # every step with a decode: prompt chunks and draft catch-ups went eagerly beside the graphs
    runner = llm.runner
    assert runner.eager_rounds == 0 and runner.graph_rounds == len(rounds)  # type: ignore[attr-defined]
    if kind == "self":  # a bf16 copy agrees nearly always: long accepted runs, both caches cut back
        assert llm.stats.acceptance_rate > 0.5
    assert graphs.target.kv_usage().used_blocks == 0
    assert graphs.drafter is not None and graphs.drafter.engine.kv_usage().used_blocks == 0


def test_graph_rounds_read_blocks_shared_through_the_prefix_cache() -> None:
    """Shared blocks are block-table entries like any other: sequences whose prompts begin alike run
    their graph rounds over the same cached blocks, in both pools, and still decode as the target
    alone does."""
    base = list(range(40, 80))  # five blocks of 8
    prompts = [[*base, 7 * i + 1, 7 * i + 2, 7 * i + 3] for i in range(4)]
    references = [reference_greedy(p, 16) for p in prompts]
    llm, graphs, rounds = graph_llm("model")
    first = llm.add_request(GenerationRequest(prompt_token_ids=prompts[0], max_tokens=16, num_draft_tokens=3))
    outputs = run_to_completion(llm)
    ids = [
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=16, num_draft_tokens=3))
        for p in prompts[1:]
    ]
    for out in llm.step():
        outputs.setdefault(out.request_id, []).append(out)
    target, draft = graphs.target, graphs.drafter.engine  # type: ignore[union-attr]
    tables = [target.blocks.block_table(seq.seq_id) for seq in llm.scheduler.running]
    assert len(tables) == 3 and tables[0][:5] == tables[1][:5] == tables[2][:5]  # held by all three
    for rid, more in run_to_completion(llm).items():
        outputs.setdefault(rid, []).extend(more)
    assert [tokens_of(outputs[rid]) for rid in [first, *ids]] == references
    assert llm.stats.cached_prompt_tokens >= 3 * len(base) and len(rounds) > 5
    assert draft.kv_usage().hit_tokens >= 3 * len(base)  # the draft model's pool shared them too
    assert llm.runner.eager_rounds == 0  # type: ignore[attr-defined]
    target.blocks.check()
    draft.blocks.check()


def prefilled():
    """Target and draft engines with three prompts cached, the draft one token behind (as after a
    round), and the decode steps of the next round."""
    target = tiny_engine(0, max_context=MAX_CONTEXT)
    draft = tiny_engine(0, dtype="bfloat16", max_context=MAX_CONTEXT)  # agrees often: drafts get accepted
    prompts = [[3, 1, 4, 1, 5], list(range(30, 45)), [9, 2, 6, 5, 3, 5, 8, 9]]
    greedy = SamplingParams()
    steps = []
    for i, p in enumerate(prompts):
        target.add_sequence(i, MAX_CONTEXT)
        draft.add_sequence(i, MAX_CONTEXT)
        last = int(target.forward([ForwardInput(i, p, 1)])[0][-1].argmax())
        draft.forward([ForwardInput(i, p[:-1] if i == 1 else p, 0)])  # seq 1's draft lacks 2 tokens
        steps.append(SeqStep(i, [*p, last], len(p), len(p) + 1, [3, 1, 2][i], greedy))
    return target, ModelDrafter(draft), steps


def test_one_graph_round_equals_the_eager_round() -> None:
    target, drafter, steps = prefilled()
    twin_target, twin_drafter, _ = prefilled()
    graphs = GraphRound(target, drafter, max_k=4, sizes=SIZES, capture=False)
    seen: list[torch.Tensor] = []
    graphs.draft_override = lambda drafts: seen.append(drafts.clone())  # look, do not touch
    plan = graphs.plan(steps, drafting_off=False)
    assert plan is not None and plan.ks == [3, 1, 2]
    outcome = graphs.run(steps, plan, drafter.rollback)
    graphed = outcome.result
    assert not outcome.eager

    requests = [DraftRequest(s.seq_id, s.token_ids, 3, s.sampling, None) for s in steps]
    eager_drafts = [p.tokens for p in twin_drafter.propose(requests)]  # the round drafts max k for all
    for s in steps:
        twin_drafter.rollback(s.seq_id, s.num_computed)
    # each sequence's own k drafts (a shorter k's surplus steps write past its reserved blocks)
    assert [seen[0][b, :k].tolist() for b, k in enumerate(plan.ks)] == [
        d[:k] for d, k in zip(eager_drafts, plan.ks)
    ]
    eager_runner = TorchSpecRunner(twin_target, twin_drafter)
    eager_runner._generators = {s.seq_id: None for s in steps}
    eager_runner._drafting = {s.seq_id for s in steps}
    eager = eager_runner._round(steps)
    assert graphed.results == eager.results
    assert any(r.num_accepted for r in graphed.results.values())
    for s in steps:
        assert target.cached_length(s.seq_id) == twin_target.cached_length(s.seq_id)
        # the graph drafted max k for every sequence: its draft cache may keep one verified token more
        kept = drafter.engine.cached_length(s.seq_id)
        assert twin_drafter.engine.cached_length(s.seq_id) <= kept <= graphed.results[s.seq_id].num_computed


def test_staging_pads_to_the_trash_block_and_rewrites_block_tables() -> None:
    engine = tiny_engine(0, max_context=MAX_CONTEXT)
    graphs = StepGraphs(engine, rows=3, logits=3, sizes=SIZES, capture=False)
    pointers = [t.data_ptr() for t in (graphs.buffers.tokens, graphs.buffers.block_tables)]
    trash_slot = engine.trash_block * engine.block_size
    engine.add_sequence(0, MAX_CONTEXT)
    engine.blocks.append(0, 20)  # 3 blocks of 8
    table = list(engine.blocks.block_table(0))
    b_pad = graphs.stage([SeqRows([1, 2], 18, table), SeqRows([], 0, []), SeqRows([7], 4, table)])
    h = graphs.host
    assert b_pad == 4
    assert h.block_tables[0, :3].tolist() == table
    assert set(h.block_tables[0, 3:].tolist()) == {engine.trash_block}
    assert h.slots[:3].tolist() == [table[2] * 8 + 2, table[2] * 8 + 3, trash_slot]  # row 2: padding
    assert h.seq_lens[:4].tolist() == [20, 0, 5, 0] and h.q_lens[:4].tolist() == [2, 0, 1, 0]
    assert h.slots[6].tolist() == table[0] * 8 + 4
    # a padding sequence, the rows past a sequence's q_len, and the padded batch: the trash slot
    assert set(h.slots[3:6].tolist() + h.slots[7:12].tolist()) == {trash_slot}
    assert set(h.block_tables[3].tolist()) == {engine.trash_block}
    # rolled back to one block, whose blocks go to another sequence: nothing stale survives
    engine.truncate(0, 6)
    engine.add_sequence(1, MAX_CONTEXT)
    engine.blocks.append(1, 16)
    graphs.stage(
        [SeqRows([5], 6, engine.blocks.block_table(0)), SeqRows([6], 15, engine.blocks.block_table(1))]
    )
    assert h.block_tables[0, 1:].tolist() == [engine.trash_block] * (graphs.max_blocks - 1)
    # the freed blocks, reused by the other sequence
    assert h.block_tables[1, :2].tolist() == engine.blocks.block_table(1) == table[1:]
    graphs.upload()
    graphs.run(2)
    assert [t.data_ptr() for t in (graphs.buffers.tokens, graphs.buffers.block_tables)] == pointers


def test_rounds_that_stay_eager() -> None:
    target, drafter, steps = prefilled()
    graphs = GraphRound(target, drafter, max_k=2, sizes=(1, 2), capture=False)

    def one(**change: object) -> list[SeqStep]:
        fields = {f: getattr(steps[0], f) for f in SeqStep.__dataclass_fields__}
        return [SeqStep(**{**fields, "num_draft_tokens": 1, **change})]  # type: ignore[arg-type]

    def ks(plan: GraphPlan | None) -> list[int] | None:
        return None if plan is None else plan.ks

    assert ks(graphs.plan(one(), False)) == [1]
    assert ks(graphs.plan(one(), True)) == [0]  # drafting off: the target's graphs alone
    assert graphs.plan(one(num_draft_tokens=3), False) is None  # past max_k
    assert (
        graphs.plan(one(sampling=SamplingParams(temperature=0.7)), False) is None
    )  # unseeded: eager says why
    assert graphs.plan(one(sampling=SamplingParams(temperature=0.7, seed=1, rule="rejection")), False) is None
    assert graphs.plan(one(sampling=SamplingParams(repetition_penalty=1.2)), False) is None
    # alternatives: a top-N of each row on the host
    assert graphs.plan(one(sampling=SamplingParams(return_log_probs=True, top_log_probs=2)), False) is None
    assert graphs.plan(one(sampling=SamplingParams(prediction=(3, 4))), False) is None  # drafts on the host
    assert graphs.plan(one(feed_to=3), False) is None  # a prompt chunk: the runner feeds it first
    assert graphs.plan(one(num_computed=3), False) is None  # likewise a prompt tail
    beyond = [*steps[0].token_ids[:-1], drafter.engine.vocab_size]
    assert graphs.plan(one(token_ids=beyond), False) is None  # a token the draft cannot embed
    # on the graph path now: sampled (seeded, coupled) rounds, log-probs, parts past the largest size
    sampled = graphs.plan(one(sampling=SamplingParams(temperature=0.7, top_p=0.9, seed=1)), False)
    assert sampled is not None and sampled.verify_mode == sampled.draft_mode == SamplerMode(True, True)
    logged = graphs.plan(one(sampling=SamplingParams(return_log_probs=True)), False)
    assert logged is not None and logged.verify_mode == SamplerMode(log_probs=True)
    assert ks(graphs.plan([*one(), *one(seq_id=1), *one(seq_id=2)], True)) == [0, 0, 0]
    drafter.engine.truncate(0, 2)  # the draft cache 4 tokens behind: caught up eagerly first
    caught = graphs.plan(one(), False)
    assert caught is not None and caught.catch_up == {0: list(steps[0].token_ids[2:-1])}
    assert graph_round_for(target, drafter, 4) is None  # a CPU target: no graph path


def test_a_failing_graph_round_falls_back_to_eager_for_good() -> None:
    prompt = repeating_prompts(1, seed=5)[0]
    llm, graphs, _ = graph_llm("model")

    def broken(*_: object) -> None:
        raise RuntimeError("simulated graph failure")

    graphs.run = broken  # type: ignore[method-assign]
    rid = llm.add_request(GenerationRequest(prompt_token_ids=prompt, max_tokens=12, num_draft_tokens=2))
    assert tokens_of(run_to_completion(llm)[rid]) == reference_greedy(prompt, 12)
    assert llm.runner.graphs is None  # type: ignore[attr-defined]


def test_adaptive_speculation_learns_the_graph_rounds_costs() -> None:
    llm, graphs, _ = graph_llm("self", adaptive_speculation=True)
    timed: list[tuple[float, float]] = []  # drafting graph rounds: (draft s, verify s)
    run = graphs.run

    def timed_run(steps, plan, rollback):  # type: ignore[no-untyped-def]
        outcome = run(steps, plan, rollback)
        if any(plan.ks) and not plan.catch_up:
            timed.append((outcome.result.draft_time_s, outcome.result.verify_time_s))
        return outcome

    graphs.run = timed_run  # type: ignore[method-assign]
    learned: list[tuple[float, float | None]] = []
    controller = llm.scheduler.controller  # type: ignore[attr-defined]
    record = controller.record_step

    def spy(ks, draft_s, verify_s, *rest):  # type: ignore[no-untyped-def]
        learned.append((draft_s, verify_s))
        return record(ks, draft_s, verify_s, *rest)

    controller.record_step = spy
    for p in repeating_prompts(4, seed=9):
        llm.add_request(GenerationRequest(prompt_token_ids=p, max_tokens=32, num_draft_tokens=4))
    run_to_completion(llm)
    assert timed and all(d > 0 and v > 0 for d, v in timed)
    assert set(timed) <= set(learned)  # every drafting graph round's timing reached the cost model
    assert controller.cost is not None
