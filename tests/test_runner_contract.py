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


def trtllm_runner(tmp: Path, ngram: bool = False) -> Built:
    """The TensorRT-LLM runner over the contract stand-in of its executor bindings (trtllm_standin):
    target = the same tiny model as ``tiny_engine(0)``, draft = seed 7 (or n-gram lookup, no draft
    engine)."""
    from trispec.drafters.ngram import NgramDrafter
    from trispec.runners.trtllm_engines import read_engine
    from trispec.runners.trtllm_executor import TrtllmExecutor
    from trispec.runners.trtllm_runner import TrtllmSpecRunner
    from trtllm_standin import Executor, write_engine

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
        )
        return Built(runner, poisoned)  # type: ignore[arg-type]
    draft_dir = write_engine(tmp / "draft", vocab_size=TINY_VOCAB, seed=7)
    runner = TrtllmSpecRunner(
        target,
        read_engine(target_dir),
        draft=TrtllmExecutor(draft_dir, kv_cache_tokens=4096),
        draft_info=read_engine(draft_dir),
        kv_tokens=4096,
        num_draft_tokens=8,
    )
    return Built(runner, poisoned)  # type: ignore[arg-type]


RUNNERS: dict[str, Callable[[Path], Built]] = {
    "torch": lambda tmp: torch_runner(),
    "trtllm": trtllm_runner,
    "trtllm-ngram": lambda tmp: trtllm_runner(tmp, ngram=True),
}


@pytest.fixture(params=list(RUNNERS))
def built(request: pytest.FixtureRequest, tmp_path: Path, trtllm_bindings: object) -> Built:
    return RUNNERS[request.param](tmp_path)


def engine_for(built: Built, **config: object) -> LLMEngine:
    tokenizer = byte_tokenizer()
    config.setdefault("adaptive_speculation", False)
    scheduler = Scheduler(
        built.runner,
        SchedulerConfig(**config),  # type: ignore[arg-type]
        encode=tokenizer.encode,
        make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
        eos_ids=frozenset(),
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
    assert checked > 50
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
