"""The engines of a sweep: the target and the drafters loaded once, an engine per arm and run, the
arms' warm-up, and one timed closed-loop run."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from trispec.bench.arms import Arm, DrafterPool
from trispec.bench.closed_loop import LoopResult, run_closed_loop
from trispec.bench.workloads import Workload
from trispec.checkpoints import load_tokenizer, resolve_checkpoint
from trispec.config import SpecDecConfig
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.engine.model import KernelClock
from trispec.engine.weights import load_checkpoint
from trispec.guided.compiler import GrammarCompiler
from trispec.llm_engine import LLMEngine
from trispec.runners.torch_build import build_engine
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler

WARMUP_TOKENS = 16
MAX_WARMUP_RUNS = 8  # an adaptive arm's controller is warm after two or three


class Bench:
    """The target engine, the drafters by name, and one scheduler per run."""

    def __init__(
        self,
        config: SpecDecConfig,
        max_concurrency: int,
        max_seq_len: int,
        max_k: int,
        sampling: Mapping[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        self.config = _with_room(config, max_concurrency, max_seq_len + max_k + 1)
        # sampled arms: every request is seeded as the server seeds it (63 random bits), prompt i
        # with the same seed in every arm, so that each arm's tokens can be compared with plain's
        self.sampling = dict(sampling or {})
        self._seeds = random.Random(seed)
        self.seeds: dict[str, list[int]] = {}
        self.tokenizer = load_tokenizer(config.target, "target")
        checkpoint = load_checkpoint(resolve_checkpoint(config.target.checkpoint, "target.checkpoint"))
        self.target = build_engine(self.config.target, "target", self.config.scheduler, checkpoint)
        self.drafters = DrafterPool(self.config, checkpoint, self.target)
        # one grammar cache for every arm, as one serving process has. Guided requests end as served
        # ones do: the complete grammar allows only the end token, which they emit (and count); with
        # no end id a complete grammar took one more round to notice, and cut the draft completing it
        vocab = self.target.vocab_size
        self.grammars = GrammarCompiler(self.tokenizer.backend, self.tokenizer.eos_ids, vocab)
        self.guided_end_id = min((i for i in self.tokenizer.eos_ids if i < vocab), default=None)
        # the target's time in its kernels per forward (the memory rows' host time per token)
        self.clock = KernelClock()
        self.target.model.kernel_clock = self.clock
        self.max_concurrency = max_concurrency
        self.max_k = max_k
        # adaptive arms keep what they learned across the sweep, as a serving process would
        self.controllers: dict[tuple[str, str], Any] = {}

    def engine(self, arm: Arm, workload: str) -> LLMEngine:
        drafter: Drafter | None = self.drafters.fresh(arm.drafter) if arm.drafter else None
        sched_config = self.config.scheduler.model_copy(
            update={
                "max_batch_size": max(self.max_concurrency, 1),
                "max_num_draft_tokens": max(self.max_k, 1),
                "default_num_draft_tokens": 0,
                "adaptive_speculation": arm.adaptive,
            }
        )
        speculation = self.config.speculation
        runner = TorchSpecRunner(
            self.target,
            drafter,
            sampling_rule=speculation.sampling_rule,
            grammar_drafts=speculation.grammar_drafts,
        )
        tokenizer = self.tokenizer
        scheduler = Scheduler(
            runner,
            sched_config,
            encode=tokenizer.encode,
            make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
            eos_ids=frozenset(),  # fixed-length outputs: every arm does the same work
            # guided requests (the json workload) end where their grammar is complete (guided_end_id)
            grammars=self.grammars,
        )
        if arm.adaptive:
            key = (arm.name, workload)
            if key in self.controllers:
                scheduler.controller = self.controllers[key]
            else:
                self.controllers[key] = scheduler.controller
        return LLMEngine(scheduler, runner)

    def run(
        self, arm: Arm, *, load: Workload, concurrency: int, max_tokens: int, on_finish: Callable[[], None]
    ) -> LoopResult:
        """One timed closed-loop run of ``arm`` over the workload's prompts, from a cold prefix cache
        (every arm runs the same prompts: a warm cache would favour the later arms)."""
        engine = self.engine(arm, load.name)
        self.clock.reset()
        self.drop_prefix_caches()
        result = run_closed_loop(
            engine,
            load.prompts,
            concurrency=concurrency,
            max_tokens=load.max_tokens or max_tokens,
            num_draft_tokens=arm.k,
            on_finish=on_finish,
            sampling=self.sampling,
            seeds=self._seeds_of(load.name, len(load.prompts)) if self.sampling else None,
            guides=load.guides,
            guided_end_id=self.guided_end_id,
        )
        result.kernel_forwards = list(self.clock.forwards)
        return result

    def drop_prefix_caches(self) -> None:
        self.target.drop_prefix_cache()
        for draft in self.drafters.engines():
            draft.drop_prefix_cache()

    def _seeds_of(self, workload: str, count: int) -> list[int]:
        if workload not in self.seeds:
            self.seeds[workload] = [self._seeds.getrandbits(63) for _ in range(count)]
        return self.seeds[workload]

    def warm_up(self, arm: Arm, load: Workload) -> int:
        """Untimed runs on the workload's warm-up prompts, returning how many: the kernels, and for
        an adaptive arm its controller's own warm-up (drafting and plain steps in turn until both
        are measured). Left to the timed runs, that warm-up fell into the first one and charged it
        draft catch-ups of whole prompts (measured: 5 % of a 13 s run at 4 requests), a cost a
        serving process pays once, not per point."""
        runs = 0
        while runs < MAX_WARMUP_RUNS:
            runs += 1
            engine = self.engine(arm, load.name)
            run_closed_loop(
                engine,
                load.warmup,
                concurrency=2,
                max_tokens=WARMUP_TOKENS,
                num_draft_tokens=arm.k,
                sampling=self.sampling,
                guides=load.warmup_guides,
                guided_end_id=self.guided_end_id,
            )
            controller = engine.scheduler.controller
            if controller is None or controller.warm:
                break
        return runs

    def draft_step_ratio(self, name: str) -> float | None:
        """A draft model's 1-token step over the target's (batch 1, median, interleaved)."""
        from trispec.bench.engine import StepTimer, interleaved_medians

        draft = self.drafters.engine(name)
        if draft is None:
            return None
        context = list(range(100, 164))
        timers = [StepTimer(e, context, 4, 3_000_000) for e in (self.target, draft)]
        try:
            t = interleaved_medians({"target": timers[0].step(1), "draft": timers[1].step(1)}, 30, 5)
        finally:
            for timer in timers:
                timer.close()
        return t["draft"] / t["target"]


def _with_room(config: SpecDecConfig, concurrency: int, seq_len: int) -> SpecDecConfig:
    """KV pools large enough for ``concurrency`` sequences of ``seq_len`` tokens (fp32 upper bound on
    the target's geometry, which no draft here exceeds); never smaller than the config's."""
    args, _ = load_checkpoint(resolve_checkpoint(config.target.checkpoint, "target.checkpoint"))
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * 4
    block = config.scheduler.block_size
    tokens = concurrency * (seq_len + 2 * block)
    mb = tokens * per_token / 2**20 * 1.1
    target = config.target.model_copy(update={"kv_cache_mb": max(config.target.kv_cache_mb, mb)})
    d = config.drafter
    update: dict[str, Any] = {"kv_cache_mb": max(d.kv_cache_mb, mb)}
    if d.model is not None:
        update["model"] = d.model.model_copy(update={"kv_cache_mb": max(d.model.kv_cache_mb, mb)})
    scheduler = config.scheduler.model_copy(
        update={"max_context": max(config.scheduler.max_context or 0, seq_len + block)}
    )
    return config.model_copy(
        update={"target": target, "drafter": d.model_copy(update=update), "scheduler": scheduler}
    )
