"""The runner contract: what any ``SpecRunner`` must do behind the seam, checked on every runner.

Each runner kind is built over tiny models by a factory that can also poison one sequence (make
every engine pass that holds it raise). The same tests run for each kind:
  * greedy output equals target-only greedy decoding for k in {0, 1, 4, 8} over a ragged batch
    (some prompts prefilled in chunks);
  * after every step, each sequence's cache holds exactly the tokens the scheduler counts as
    computed (all verified tokens but the pending one, once its prompt is in);
  * a sequence that raises alone fails alone, and the rest finish exact;
  * cancelling frees the sequence's blocks at once, and every pool is empty when all is done.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiny import TINY_VOCAB, FaultyEngine, byte_tokenizer, reference_greedy, tiny_engine, tokens_of
from trispec.config import SchedulerConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.model_drafter import ModelDrafter
from trispec.llm_engine import LLMEngine
from trispec.request import GenerationRequest
from trispec.runners.base import SpecRunner
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler
from trispec.sequence import FinishReason

MAX_TOKENS = 24


@dataclass
class Built:
    runner: SpecRunner
    # sequences whose engine passes raise (mutable: add ids to poison them)
    poisoned: set[int]


def torch_runner() -> Built:
    poisoned: set[int] = set()
    target = FaultyEngine(tiny_engine(0), poisoned)
    # a different model drafts, so that drafts are often rejected and rollback is exercised
    drafter = ModelDrafter(FaultyEngine(tiny_engine(7), poisoned))  # type: ignore[arg-type]
    return Built(TorchSpecRunner(target, drafter), poisoned)  # type: ignore[arg-type]


def trtllm_runner(tmp: Path, ngram: bool = False, end_id: int | None = None) -> Built:
    """The TensorRT-LLM runner over the stand-in of its executor bindings (trtllm_standin): target =
    the same tiny model as ``tiny_engine(0)``, draft = that model with noise added (it agrees on ~40 %
    of greedy tokens: TensorRT-LLM decodes on to k + 1 tokens after a rejection, so a round always
    advances k + 1 and a draft of another seed would rarely be accepted in so few rounds), or n-gram
    lookup with no draft engine."""
    from trispec.drafters.ngram import NgramDrafter
    from trispec.runners.trtllm_engines import read_engine
    from trispec.runners.trtllm_executor import TrtllmExecutor
    from trispec.runners.trtllm_runner import TrtllmSpecRunner
    from trtllm_standin import Executor
    from trtllm_standin_engine import write_engine

    poisoned: set[int] = set()
    Executor.poisoned = poisoned
    target_dir = write_engine(tmp / "target", vocab_size=TINY_VOCAB, seed=0, spec_mode=2, max_draft_len=8)
    target = TrtllmExecutor(target_dir, kv_cache_tokens=4096)
    if ngram:
        runner = TrtllmSpecRunner(
            target,
            read_engine(target_dir),
            drafter=NgramDrafter(TINY_VOCAB),
            kv_tokens=4096,
            num_draft_tokens=8,
            end_id=end_id,
        )
        return Built(runner, poisoned)  # type: ignore[arg-type]
    draft_dir = write_engine(tmp / "draft", vocab_size=TINY_VOCAB, seed=0, noise=0.1)
    runner = TrtllmSpecRunner(
        target,
        read_engine(target_dir),
        draft=TrtllmExecutor(draft_dir, kv_cache_tokens=4096),
        draft_info=read_engine(draft_dir),
        kv_tokens=4096,
        num_draft_tokens=8,
        end_id=end_id,
    )
    return Built(runner, poisoned)  # type: ignore[arg-type]


# each factory takes the tokenizer's end id (the TensorRT-LLM runner forwards it to the executors;
# the torch runner leaves end ids to the scheduler)
RUNNERS: dict[str, Callable[..., Built]] = {
    "torch": lambda tmp, end_id=None: torch_runner(),
    "trtllm": trtllm_runner,
    "trtllm-ngram": lambda tmp, end_id=None: trtllm_runner(tmp, ngram=True, end_id=end_id),
}


@pytest.fixture(params=list(RUNNERS))
def built(request: pytest.FixtureRequest, tmp_path: Path, trtllm_bindings: object) -> Built:
    return RUNNERS[request.param](tmp_path)


def engine_for(built: Built, eos_ids: frozenset[int] = frozenset(), **config: object) -> LLMEngine:
    tokenizer = byte_tokenizer()
    config.setdefault("adaptive_speculation", False)
    scheduler = Scheduler(
        built.runner,
        SchedulerConfig(**config),  # type: ignore[arg-type]
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=eos_ids,
    )
    return LLMEngine(scheduler, built.runner)


def ragged_prompts(n: int = 8, seed: int = 4) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.choice([1, 3, 9, 30, 70]))] for _ in range(n)]


def submit(llm: LLMEngine, prompts: list[list[int]], k: int, **kw: object) -> list[int]:
    return [
        llm.add_request(
            GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=k, **kw)
        )  # type: ignore[arg-type]
        for p in prompts
    ]


def drain(llm: LLMEngine, check: Callable[[], None] | None = None) -> dict[int, list]:
    outputs: dict[int, list] = {}
    for _ in range(10_000):
        if not llm.has_work():
            return outputs
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
        if check is not None:
            check()
    raise AssertionError("did not finish")


@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_greedy_equals_target_only_over_a_ragged_batch(built: Built, k: int) -> None:
    prompts = ragged_prompts()
    llm = engine_for(built, max_prefill_tokens_per_step=40)  # the 70-token prompts go in chunks
    ids = submit(llm, prompts, k)
    outputs = drain(llm)
    for rid, prompt in zip(ids, prompts):
        assert tokens_of(outputs[rid]) == reference_greedy(prompt, MAX_TOKENS), (k, len(prompt))
    if k:
        assert llm.stats.draft_tokens > 0 and llm.stats.accepted_tokens < llm.stats.draft_tokens
        assert llm.stats.accepted_tokens > 0


def eos_cases() -> tuple[list[list[int]], list[list[int]], int]:
    """Prompts, their target-only greedy outputs, and the token most of those outputs reach early:
    it plays the tokenizer's end token."""
    prompts = ragged_prompts(12, seed=3)
    refs = [reference_greedy(p, MAX_TOKENS) for p in prompts]
    counts = Counter(t for ref in refs for t in set(ref[: MAX_TOKENS - 6]))
    return prompts, refs, counts.most_common(1)[0][0]


def until_end(ref: list[int], end_ids: set[int]) -> list[int]:
    for i, token in enumerate(ref):
        if token in end_ids:
            return ref[: i + 1]
    return ref


@pytest.mark.parametrize("k", [0, 4])
@pytest.mark.parametrize("kind", [*RUNNERS, "trtllm-stops-after-verify"])
def test_requests_that_end_on_an_end_token_equal_target_only(
    kind: str, k: int, tmp_path: Path, trtllm_bindings: object
) -> None:
    """The tokenizer's end token (which the TensorRT-LLM runner forwards to the executors, and which
    TensorRT-LLM never returns as a token), a request's own end_id, and end_id -1 (ignore the end
    token): each output equals target-only greedy decoding cut at its end token, finishing STOP.
    The TensorRT-LLM runner also over a runtime that stops a verify request after its accepted drafts
    + 1 instead of decoding on to len(draft) + 1."""
    if kind == "trtllm-stops-after-verify":
        trtllm_bindings.Executor.decodes_on = False  # type: ignore[attr-defined]
        kind = "trtllm"
    prompts, refs, eos = eos_cases()
    built = RUNNERS[kind](tmp_path, end_id=eos)
    llm = engine_for(built, eos_ids=frozenset({eos}))
    end_ids: list[int | None] = [None] * len(prompts)
    end_ids[0], end_ids[2] = refs[0][7], refs[2][5]  # the request's own end token
    end_ids[3] = -1  # no end token: the tokenizer's is an ordinary token
    ids = [
        llm.add_request(
            GenerationRequest(prompt_token_ids=p, max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=e)
        )
        for p, e in zip(prompts, end_ids)
    ]
    outputs = drain(llm)
    stopped = 0
    for rid, ref, end_id in zip(ids, refs, end_ids):
        stops = {eos} if end_id is None else set() if end_id == -1 else {end_id}
        want = until_end(ref, stops)
        assert tokens_of(outputs[rid]) == want, (kind, k, end_id)
        finish = outputs[rid][-1].finish_reason
        assert finish is (FinishReason.STOP if want[-1] in stops else FinishReason.LENGTH)
        stopped += finish is FinishReason.STOP
    assert eos in refs[3] and stopped > len(prompts) // 2


def test_caches_hold_exactly_the_computed_tokens_after_every_step(built: Built) -> None:
    llm = engine_for(built, max_prefill_tokens_per_step=40)
    submit(llm, ragged_prompts(), 4)
    checked = 0

    def check() -> None:
        nonlocal checked
        for seq in llm.scheduler.running:
            assert built.runner.cached_length(seq.seq_id) == seq.num_computed, seq.seq_id
            if seq.output_ids:  # past its prompt: everything verified but the pending token
                assert seq.num_computed == seq.num_tokens - 1
            checked += 1

    drain(llm, check)
    assert checked > 30  # 8 sequences over several rounds (a TensorRT-LLM round advances k + 1)
    assert all(pool.used_blocks == 0 for pool in built.runner.kv_usage().values())


@pytest.mark.parametrize("victim", [0, 4])  # 4 has a 70-token prompt: it fails while prefilling
def test_a_sequence_that_fails_alone_fails_alone(built: Built, victim: int) -> None:
    prompts = ragged_prompts()
    assert len(prompts[4]) == 70
    llm = engine_for(built, max_prefill_tokens_per_step=40)
    built.poisoned.add(victim)
    ids = submit(llm, prompts, 4)
    outputs = drain(llm)
    failed = outputs[ids[victim]][-1]
    assert failed.finished and failed.finish_reason is FinishReason.ERROR and failed.error
    for rid, prompt in zip(ids, prompts):
        if rid != ids[victim]:
            assert tokens_of(outputs[rid]) == reference_greedy(prompt, MAX_TOKENS), rid
    assert all(pool.used_blocks == 0 for pool in built.runner.kv_usage().values())


def test_cancel_frees_the_blocks(built: Built) -> None:
    prompts = ragged_prompts()
    llm = engine_for(built)
    ids = submit(llm, prompts, 4)
    outputs: dict[int, list] = {}
    for _ in range(3):
        for out in llm.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert built.runner.kv_usage()["target"].used_blocks > 0
    victim = ids[5]
    llm.cancel(victim)
    for rid, outs in drain(llm).items():
        outputs.setdefault(rid, []).extend(outs)
    assert outputs[victim][-1].finish_reason is FinishReason.CANCELLED
    assert len(tokens_of(outputs[victim])) < MAX_TOKENS
    for rid, prompt in zip(ids, prompts):
        if rid != victim:
            assert tokens_of(outputs[rid]) == reference_greedy(prompt, MAX_TOKENS)
    assert all(pool.used_blocks == 0 for pool in built.runner.kv_usage().values())
    # cancelling everything mid-run empties every pool within the next step
    ids = submit(llm, prompts, 4)
    for _ in range(3):
        llm.step()
    for rid in ids:
        llm.cancel(rid)
    llm.step()
    assert not llm.has_work()
    assert all(pool.used_blocks == 0 for pool in built.runner.kv_usage().values())
