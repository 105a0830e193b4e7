"""``specdec-bench``: speculative vs plain decoding of any draft/target pair, in one run.

The pair comes from a YAML config (``--config``; default: the built-in SmolLM2 self-draft). For each
workload (HumanEval code, ShareGPT chat, "edit this code") and each concurrency of the sweep, the same
prompts run closed-loop through the real in-flight batcher in every arm: ``plain`` (k = 0, the same
loop), ``<drafter>-k<N>`` (a fixed k) and ``<drafter>-adaptive`` (per-request k chosen by measured
goodput, capped at the largest ``--k``). Greedy, fixed-length outputs (end-of-sequence ignored), so
every arm does the same work and must give plain's exact tokens (``identical_to_plain``).

Per arm and concurrency: generated tokens/s and the speed-up over plain, TTFT and inter-token latency
percentiles, acceptance overall and per draft position, the mean k chosen. Also, on request: the peak
RSS of loading the pair against its weights (``--load-memory``, a child process under
``/usr/bin/time -v``), and Hugging Face assisted generation on the same pair and prompts
(``--hf-reference``). Not a test: these machines are noisy; ratios measured in one run are what count.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trispec.bench.arms import PLAIN, Arm, DrafterPool, default_drafters, make_arms, variant
from trispec.bench.closed_loop import LoopResult, run_closed_loop
from trispec.checkpoints import load_tokenizer
from trispec.config import SpecDecConfig, load_config
from trispec.detokenize import StopTextTracker
from trispec.drafters.base import Drafter
from trispec.engine.weights import load_checkpoint
from trispec.errors import ConfigError
from trispec.llm_engine import LLMEngine
from trispec.runners.torch_build import build_engine
from trispec.runners.torch_runner import TorchSpecRunner
from trispec.scheduler import Scheduler
from trispec.tokenizer import Tokenizer

WARMUP_TOKENS = 16
MAX_WARMUP_RUNS = 8  # an adaptive arm's controller is warm after two or three


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]  # timed, in order
    warmup: list[list[int]]  # other prompts of the same workload, untimed


def load_workloads(
    names: list[str], tokenizer: Tokenizer, n: int, n_warmup: int, seed: int, max_prompt: int
) -> list[Workload]:
    from trispec.bench import workloads

    out = []
    for name in names:
        pool = workloads.load(name, workloads.available(name), seed)
        encoded = []
        for prompt in pool:
            text = prompt.text  # a base model without a chat template takes the text as it is
            if tokenizer.info.chat_template is not None:
                text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}])
            ids = tokenizer.encode(text)
            if len(ids) <= max_prompt:  # room for the output within the context
                encoded.append(ids)
            if len(encoded) == n + n_warmup:
                break
        if len(encoded) < n + n_warmup:
            raise SystemExit(f"workload {name}: only {len(encoded)} prompts fit in {max_prompt} tokens")
        out.append(Workload(name, encoded[:n], encoded[n:]))
    return out


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    if not values:
        return {f"p{p}": None for p in ps}
    return {f"p{p}": float(np.percentile(values, p)) for p in ps}


class Bench:
    """The target engine, the drafters by name, and one scheduler per run."""

    def __init__(self, config: SpecDecConfig, max_concurrency: int, max_seq_len: int, max_k: int) -> None:
        self.config = _with_room(config, max_concurrency, max_seq_len + max_k + 1)
        self.tokenizer = load_tokenizer(config.target, "target")
        checkpoint = load_checkpoint(config.target.checkpoint.resolve("target.checkpoint"))
        self.target = build_engine(self.config.target, "target", self.config.scheduler, checkpoint)
        self.drafters = DrafterPool(self.config, checkpoint, self.target)
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
        runner = TorchSpecRunner(self.target, drafter)
        tokenizer = self.tokenizer
        scheduler = Scheduler(
            runner,
            sched_config,
            encode=tokenizer.encode,
            make_text_tracker=lambda stop: StopTextTracker(tokenizer, stop),
            eos_ids=frozenset(),  # fixed-length outputs: every arm does the same work
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
        """One timed closed-loop run of ``arm`` over the workload's prompts."""
        engine = self.engine(arm, load.name)
        return run_closed_loop(
            engine,
            load.prompts,
            concurrency=concurrency,
            max_tokens=max_tokens,
            num_draft_tokens=arm.k,
            on_finish=on_finish,
        )

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
                engine, load.warmup, concurrency=2, max_tokens=WARMUP_TOKENS, num_draft_tokens=arm.k
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


MAX_REPEATS = 16


def run_point(
    arms: list[Arm],
    run: Callable[[Arm], LoopResult],
    repeats: int,
    min_seconds: float = 0.0,
    on_extra_repeat: Callable[[], None] = lambda: None,
) -> dict[str, list[LoopResult]]:
    """Every arm's runs at one point: ``repeats`` rounds, then more (in pairs, up to MAX_REPEATS)
    until every arm has run ``min_seconds`` in all. Rounds alternate the arms' order (A B, B A, ...),
    so that drift on a noisy machine spreads evenly over them; a short point thus gets more rounds
    than a long one, where one run already averages over a long time."""
    runs: dict[str, list[LoopResult]] = {arm.name: [] for arm in arms}

    def one_round() -> None:
        order = arms if len(runs[arms[0].name]) % 2 == 0 else arms[::-1]
        for arm in order:
            runs[arm.name].append(run(arm))

    def short() -> bool:
        return min(sum(r.elapsed_s for r in done) for done in runs.values()) < min_seconds

    for _ in range(repeats):
        one_round()
    while short() and len(runs[arms[0].name]) + 2 <= MAX_REPEATS:
        for _ in range(2):  # a pair keeps both orders equally often
            on_extra_repeat()
            one_round()
    return runs


def _with_room(config: SpecDecConfig, concurrency: int, seq_len: int) -> SpecDecConfig:
    """KV pools large enough for ``concurrency`` sequences of ``seq_len`` tokens (fp32 upper bound on
    the target's geometry, which no draft here exceeds); never smaller than the config's."""
    args, _ = load_checkpoint(config.target.checkpoint.resolve("target.checkpoint"))
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


def row(workload: str, concurrency: int, arm: Arm, result: LoopResult, plain: dict[str, Any] | None) -> dict:
    stats = result.stats
    drafted, accepted = stats.drafted_per_position, stats.accepted_per_position
    per_position = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    speedup = result.tok_s / plain["tok_s"] if plain else None
    identical = None
    if plain and arm.name != PLAIN:
        identical = result.token_ids == plain["token_ids"] and result.repeats_agree
    return {
        "workload": workload,
        "concurrency": concurrency,
        "arm": arm.name,
        "drafter": arm.drafter,
        "k": arm.k,
        "adaptive": arm.adaptive,
        "requests": len(result.token_ids) * result.repeats,
        "tokens": result.num_tokens,
        "seconds": round(result.elapsed_s, 4),
        "tok_s": round(result.tok_s, 3),
        "tok_s_runs": [round(t, 3) for t in result.tok_s_runs],
        "speedup_vs_plain": round(speedup, 4) if speedup is not None else None,
        "acceptance": round(stats.acceptance_rate, 4) if arm.drafter else None,
        "accepted_per_position": [round(p, 4) for p in per_position],
        "mean_accepted_length": round(stats.mean_accepted_length, 4),
        "rounds": stats.rounds,
        "draft_tokens": stats.draft_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "mean_k": round(stats.mean_num_draft_tokens, 3),
        "draft_time_share": round(stats.draft_time_s / result.elapsed_s, 4),
        "ttft_s": {p: _round(v) for p, v in percentiles(result.ttft_s).items()},
        "itl_s": {p: _round(v) for p, v in percentiles(result.itl_s).items()},
        "identical_to_plain": identical,
        "token_ids": result.token_ids,  # dropped from the printed rows
    }


def combined_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Workload ``all``: each arm and concurrency over every workload together (tokens over seconds
    summed), the mix a server sees; latency percentiles stay per workload."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["acceptance"] is not None or r["arm"] == PLAIN:  # not the Hugging Face reference rows
            groups.setdefault((r["concurrency"], r["arm"]), []).append(r)
    plain_tok_s: dict[int, float] = {}
    for (concurrency, arm), group in groups.items():
        tokens, seconds = sum(r["tokens"] for r in group), sum(r["seconds"] for r in group)
        first = group[0]
        drafted, accepted = sum(r["draft_tokens"] for r in group), sum(r["accepted_tokens"] for r in group)
        rounds = sum(r["rounds"] for r in group)
        identical = [r["identical_to_plain"] for r in group]
        combined = {
            **{k: first[k] for k in ("concurrency", "arm", "drafter", "k", "adaptive")},
            "workload": "all",
            "requests": sum(r["requests"] for r in group),
            "tokens": tokens,
            "seconds": round(seconds, 4),
            "tok_s": round(tokens / seconds, 3),
            "tok_s_runs": _combined_runs(group),
            "speedup_vs_plain": None,
            "acceptance": None if first["acceptance"] is None else round(accepted / max(drafted, 1), 4),
            "mean_k": round(sum(r["mean_k"] * r["rounds"] for r in group) / max(rounds, 1), 3),
            "rounds": rounds,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "identical_to_plain": None if arm == PLAIN else all(identical),
            "workloads": [r["workload"] for r in group],
        }
        if arm == PLAIN:
            plain_tok_s[concurrency] = combined["tok_s"]
        out.append(combined)
    for r in out:
        if r["arm"] != PLAIN and r["concurrency"] in plain_tok_s:
            r["speedup_vs_plain"] = round(r["tok_s"] / plain_tok_s[r["concurrency"]], 4)
    return out


def _combined_runs(group: list[dict[str, Any]]) -> list[float]:
    """Repeat j over every workload: its tokens over its seconds (repeats ran in the same order)."""
    runs = [r["tok_s_runs"] for r in group]
    if len({len(t) for t in runs}) != 1:
        return []
    per_run = [r["tokens"] / len(r["tok_s_runs"]) for r in group]
    return [
        round(sum(per_run) / sum(n / t[j] for n, t in zip(per_run, runs)), 3) for j in range(len(runs[0]))
    ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"{flag}: every value must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", type=Path, help="the pair's YAML (default: the built-in SmolLM2 config)")
    p.add_argument("--workloads", default="humaneval,sharegpt,edit", help="comma-separated")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="closed-loop clients, comma-separated")
    p.add_argument("--drafters", help="comma-separated (trispec.bench.arms); default: the config's, suffix")
    p.add_argument("--k", default="4", help="fixed draft lengths, comma-separated; the largest caps adaptive")
    p.add_argument("--arms", default="fixed,adaptive", help="which drafting arms: fixed, adaptive or both")
    p.add_argument("--num-prompts", type=int, default=16, help="requests per workload and concurrency")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--repeats", type=int, default=1, help="runs per arm and point, in alternating order")
    p.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="more runs (in pairs, up to 16) until every arm has run this long at each point",
    )
    p.add_argument("--seed", type=int, default=0, help="which prompts are drawn")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load-memory", action="store_true", help="measure peak RSS while loading the pair")
    p.add_argument("--hf-reference", action="store_true", help="HF assisted generation, same pair/prompts")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write speedup.png and acceptance.png there")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trispec.bench.report import Reporter

    concurrencies = parse_ints(args.concurrency, "--concurrency")
    ks = parse_ints(args.k, "--k")
    modes = {m.strip() for m in args.arms.split(",") if m.strip()}
    if not modes <= {"fixed", "adaptive"} or not modes:
        raise SystemExit("--arms: fixed, adaptive or fixed,adaptive")
    if args.num_prompts < 1 or args.max_tokens < 1 or args.repeats < 1:
        raise SystemExit("--num-prompts, --max-tokens and --repeats must be >= 1")
    if args.min_seconds < 0:
        raise SystemExit("--min-seconds must be >= 0")
    from trispec.bench import workloads

    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not names or not set(names) <= set(workloads.WORKLOADS):
        raise SystemExit(f"--workloads: comma-separated names from {', '.join(workloads.WORKLOADS)}")
    torch.set_num_threads(args.threads)
    try:
        config = load_config(args.config)
        if config.engine.kind != "torch":
            raise SystemExit("specdec-bench runs the torch engine (engine.kind: torch)")
        drafters = default_drafters(config)
        if args.drafters:
            drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
        for name in drafters:
            variant(config, name)  # unknown names fail before anything loads
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    arms = make_arms(drafters, ks, adaptive="adaptive" in modes, fixed="fixed" in modes)
    reporter = Reporter(json_lines=args.json)
    reporter.header(config, args, drafters)

    if args.load_memory:  # children first: nothing of ours is loaded yet
        from trispec.bench.load_memory import measure

        reporter.load_memory(measure(args.config, args.threads))

    tokenizer = load_tokenizer(config.target, "target")
    max_context = config.scheduler.max_context or 4096
    max_prompt = max_context - args.max_tokens - max(ks) - 1
    try:
        loads = load_workloads(names, tokenizer, args.num_prompts, 2, args.seed, max_prompt)
    except workloads.WorkloadDataMissing as exc:
        raise SystemExit(f"workload data: {exc}") from None
    longest = max(len(p) for w in loads for p in w.prompts + w.warmup)

    hf = None
    if args.hf_reference:
        from trispec.bench.hf_reference import run_reference

        k, threads = max(ks), args.threads
        hf = {
            w.name: run_reference(config, w.prompts, max_tokens=args.max_tokens, k=k, threads=threads)
            for w in loads
        }

    bench = Bench(config, max(concurrencies), longest + args.max_tokens, max(ks))
    for name in drafters:
        ratio = bench.draft_step_ratio(name)
        if ratio is not None:
            reporter.draft_cost(name, ratio)

    rows: list[dict[str, Any]] = []
    total = len(loads) * len(concurrencies) * len(arms) * args.num_prompts * args.repeats
    with reporter.progress(total) as progress:
        for load in loads:
            for arm in arms:
                bench.warm_up(arm, load)
            for concurrency in concurrencies:
                run = functools.partial(
                    bench.run,
                    load=load,
                    concurrency=concurrency,
                    max_tokens=args.max_tokens,
                    on_finish=progress.advance,
                )
                extend = functools.partial(progress.extend, len(arms) * args.num_prompts)
                runs = run_point(arms, run, args.repeats, args.min_seconds, extend)
                plain: dict[str, Any] | None = None
                for arm in arms:
                    result = LoopResult.merged(runs[arm.name])
                    r = row(load.name, concurrency, arm, result, plain)
                    if arm.name == PLAIN:
                        plain = r
                    rows.append(r)
                    reporter.run_row(r)
            if hf is not None:
                rows += reporter.hf_rows(load.name, hf[load.name], rows, max(ks))
    if len(loads) > 1:
        for r in combined_rows(rows):
            rows.append(r)
            reporter.run_row(r)
    reporter.summary(rows)
    if args.plot is not None:
        from trispec.bench.plots import write_plots

        for path in write_plots(rows, args.plot):
            reporter.note(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
