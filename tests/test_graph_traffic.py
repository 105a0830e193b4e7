"""All the traffic on the graph path (``capture=False``: the same static buffers and steps, run eagerly
on the CPU), each case against the eager runner on the same weights: seeded sampled requests (the
coupled rule on the device, top-k / top-p, log-probs) drafted by a model, suffix drafts (no draft
replays) and suffix beside a model, steps that also feed prompt chunks, and batches of 64 and 256
sequences in graph-sized parts. Every case is counted in ``graph_rounds`` with no eager round."""

from __future__ import annotations

import torch
from tiny import TINY_VOCAB, byte_tokenizer, repeating_prompts, run_to_completion, tiny_engine, tokens_of
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.drafters.model_drafter import ModelDrafter
from trispec.drafters.suffix import SuffixDrafter
from trispec.drafters.with_suffix import WithSuffix
from trispec.engine.base import ForwardInput
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.graph_round import GraphRound
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.sampling_params import SamplingParams
from trispec.scheduler import Scheduler
from trispec.step import SeqStep, StepPlan

MAX_CONTEXT = 128


def drafter_of(kind: str) -> Drafter | None:
    model = ModelDrafter(tiny_engine(7, max_context=MAX_CONTEXT))
    suffix = SuffixDrafter(TINY_VOCAB)
    return {"none": None, "model": model, "suffix": suffix, "with_suffix": WithSuffix(model, suffix)}[kind]


def llm_of(kind: str, graph: bool, sizes=(1, 2, 4, 8), blocks: int = 256, **config: object) -> LLMEngine:
    target = tiny_engine(0, max_context=MAX_CONTEXT, num_blocks=blocks)
    drafter = drafter_of(kind)
    graphs = GraphRound(target, drafter, max_k=4, sizes=sizes, capture=False) if graph else None
    runner = TorchSpecRunner(target, drafter, graphs)
    tokenizer = byte_tokenizer()
    config.setdefault("adaptive_speculation", False)
    scheduler = Scheduler(
        runner,
        SchedulerConfig(max_num_draft_tokens=4, **config),
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=tokenizer.eos_ids,
    )
    return LLMEngine(scheduler, runner)


def serve(llm: LLMEngine, requests: list[GenerationRequest], late: int = 0) -> list[tuple[list[int], list]]:
    """Run the requests, the last ``late`` of them arriving while the others decode."""
    ids = [llm.add_request(r) for r in requests[: len(requests) - late]]
    outputs: dict[int, list] = {}
    for _ in range(3):
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    ids += [llm.add_request(r) for r in requests[len(requests) - late :]]
    for request_id, outs in run_to_completion(llm).items():
        outputs.setdefault(request_id, []).extend(outs)
    return [(tokens_of(outputs[i]), [x for out in outputs[i] for x in out.new_log_probs or []]) for i in ids]


def same_as_eager(
    kind: str, requests: list[GenerationRequest], late: int = 0, prepare=None, **kw: object
) -> LLMEngine:
    graphed = llm_of(kind, True, **kw)
    if prepare is not None:
        prepare(graphed.runner.graphs)  # type: ignore[attr-defined]
    got = serve(graphed, requests, late)
    expected = serve(llm_of(kind, False, **kw), requests, late)
    assert [tokens for tokens, _ in got] == [tokens for tokens, _ in expected]
    for (_, lp), (_, lp_eager) in zip(got, expected):  # the static step's logits: within float32 rounding
        assert torch.allclose(torch.tensor(lp), torch.tensor(lp_eager), atol=1e-4)
    runner = graphed.runner
    assert runner.graph_rounds > 0 and runner.eager_rounds == 0  # type: ignore[attr-defined]
    return graphed


SAMPLED = [
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=0.7, top_k=20, seed=2**64 - 3),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=5, return_log_probs=True),
    SamplingParams(),
    SamplingParams(temperature=0.7, top_p=0.5, seed=9),
    SamplingParams(return_log_probs=True),
]


def requests_of(params: list[SamplingParams], prompts: list[list[int]], max_tokens: int = 16):
    return [
        GenerationRequest(
            prompt_token_ids=p,
            max_tokens=max_tokens,
            num_draft_tokens=[2, 4, 3][i % 3],
            **{f: getattr(sp, f) for f in ("temperature", "top_k", "top_p", "seed", "return_log_probs")},
        )
        for i, (sp, p) in enumerate(zip(params, prompts))
    ]


def test_sampled_rounds_drafted_by_a_model_with_arrivals_give_the_eager_tokens() -> None:
    # a small prefill budget and two late arrivals: prompt chunks ride along with graph rounds
    requests = requests_of(SAMPLED, repeating_prompts(6, seed=4))
    llm = same_as_eager("model", requests, late=2, max_prefill_tokens_per_step=10)
    assert llm.stats.acceptance_rate > 0  # the tiny draft agrees at times, sampled rows included


def test_suffix_drafts_ride_on_the_verify_graph_with_no_draft_replays() -> None:
    prompts = repeating_prompts(4, seed=2)
    requests = requests_of(SAMPLED[:4], prompts, max_tokens=24)
    llm = same_as_eager("suffix", requests)
    assert llm.runner.graphs.first is None  # type: ignore[attr-defined]  # no draft model, no replays
    assert llm.stats.draft_tokens > 0


def test_suffix_beside_a_model_on_the_graph_path() -> None:
    requests = requests_of(SAMPLED[:4], repeating_prompts(4, seed=2), max_tokens=24)
    llm = same_as_eager("with_suffix", requests, late=1)
    drafter = llm.runner.drafter  # type: ignore[attr-defined]
    assert drafter.num_suffix_proposals > 0 and drafter.num_model_proposals > 0


def test_64_and_256_sequences_take_the_graph_path_in_graph_sized_parts() -> None:
    prompts = [[(7 * i + j) % 256 for j in range(3 + i % 4)] for i in range(256)]
    parts: list[int] = []

    def count_parts(graphs: GraphRound) -> None:
        run = graphs._run
        graphs._run = lambda steps, plan, rollback: parts.append(len(steps)) or run(steps, plan, rollback)  # type: ignore[method-assign]

    for n in (64, 256):
        requests = [GenerationRequest(prompt_token_ids=p, max_tokens=3) for p in prompts[:n]]
        kw = {"sizes": (1, 2, 4, 8, 16, 32, 64), "blocks": 1200, "max_batch_size": 256}
        llm = same_as_eager("none", requests, prepare=count_parts, max_prefill_tokens_per_step=2048, **kw)
        assert llm.stats.max_verify_batch == n
    assert max(parts) == 64 and parts.count(64) >= 1 + 4  # 256 sequences: four parts of 64


def test_a_mixed_step_gives_the_eager_steps_outputs() -> None:
    """One step: two decodes (one drafting, one sampled) beside a newcomer's prompt chunk and a
    prompt tail fed before a first decode; results and both caches as the eager step leaves them."""

    def runner(graph: bool) -> tuple[TorchSpecRunner, list[SeqStep]]:
        target = tiny_engine(0, max_context=MAX_CONTEXT)
        drafter = ModelDrafter(tiny_engine(0, dtype="bfloat16", max_context=MAX_CONTEXT))
        graphs = GraphRound(target, drafter, max_k=4, sizes=(1, 2, 4), capture=False) if graph else None
        r = TorchSpecRunner(target, drafter, graphs)
        prompts = [[3, 1, 4, 1, 5], list(range(30, 45)), list(range(60, 80)), [9, 2, 6, 5, 3, 5]]
        sampled = SamplingParams(temperature=0.8, top_k=30, seed=7, prompt_len=15)
        for i in range(len(prompts)):
            r.add(i, MAX_CONTEXT, sampled if i == 1 else SamplingParams(), drafts=True)
        for i in (0, 1):
            last = int(target.forward([ForwardInput(i, prompts[i], 1)])[0][-1].argmax())
            prompts[i] = [*prompts[i], last]
        target.forward([ForwardInput(3, prompts[3][:2], 0)])
        steps = [
            SeqStep(0, prompts[0], 5, 6, 3, SamplingParams()),
            SeqStep(1, prompts[1], 15, 16, 2, sampled),
            SeqStep(2, prompts[2], 0, 12, 0, SamplingParams()),  # a prompt chunk
            SeqStep(3, prompts[3], 2, 6, 2, SamplingParams()),  # the prompt's tail, then a first decode
        ]
        return r, steps

    graphed, steps = runner(True)
    eager, _ = runner(False)
    got, expected = graphed.run(StepPlan(steps)), eager.run(StepPlan(steps))
    assert graphed.graph_rounds == 1 and graphed.eager_rounds == 0
    assert got.results == expected.results
    for s in steps:
        assert graphed.target.cached_length(s.seq_id) == eager.target.cached_length(s.seq_id)
