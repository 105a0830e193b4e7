"""``specdec-bench``: speculative vs plain decoding of any draft/target pair, in one run.

The pair comes from a YAML config (``--config``; default: the built-in SmolLM2 self-draft). For each
workload (HumanEval code, ShareGPT chat, "edit this code", schema-guided JSON and the same prompts
unguided) and each concurrency of the sweep, the same
prompts run closed-loop through the real in-flight batcher in every arm: ``plain`` (k = 0, the same
loop), ``<drafter>-k<N>`` (a fixed k) and ``<drafter>-adaptive`` (per-request k chosen by measured
goodput, capped at the largest ``--k``). Greedy by default, or sampled (``--temperature``, ``--top-k``,
``--top-p``: every request seeded as the server seeds it, each prompt with the same seed in every arm);
fixed-length outputs (end-of-sequence ignored), so every arm does the same work and must give plain's
exact tokens (``identical_to_plain``; under ``--sampling-rule rejection`` sampled arms differ).

Per arm and concurrency: generated tokens/s and the speed-up over plain, TTFT and inter-token latency
percentiles, acceptance overall and per draft position, the mean k chosen. Also, on request: the peak
RSS of loading the pair against its weights (``--load-memory``, a child process under
``/usr/bin/time -v``), and Hugging Face assisted generation on the same pair and prompts
(``--hf-reference``), and llama.cpp's llama-bench on the same GGUF files (``--anchor-llamacpp``).
``--workloads multiturn`` runs conversations against the prefix cache instead, with llama-server on
the same GGUF file (``--llama-server``): ``bench/multiturn.py``.
Not a test: these machines are noisy; ratios measured in one run are what count.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trispec.bench import workloads
from trispec.bench.arms import PLAIN, Arm, default_drafters, make_arms, variant
from trispec.bench.closed_loop import LoopResult
from trispec.bench.harness import MAX_WARMUP_RUNS, WARMUP_TOKENS, Bench
from trispec.bench.rows import _combined_runs, combined_rows, percentiles, row
from trispec.bench.sweep import MAX_REPEATS, run_point
from trispec.bench.workloads import Workload, load_workloads
from trispec.checkpoints import load_tokenizer, resolve_checkpoint
from trispec.config import SpecDecConfig, load_config
from trispec.errors import ConfigError, InvalidInputError
from trispec.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trispec.bench.hf_reference import HFResult
    from trispec.bench.llamacpp import Anchor
    from trispec.bench.report import Reporter

# the parts of specdec-bench, importable from here as before the split
__all__ = [
    "MAX_REPEATS",
    "MAX_WARMUP_RUNS",
    "WARMUP_TOKENS",
    "Bench",
    "Workload",
    "_combined_runs",
    "build_parser",
    "combined_rows",
    "load_workloads",
    "main",
    "parse_ints",
    "percentiles",
    "row",
    "run_point",
]


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
    p.add_argument("--seed", type=int, default=0, help="which prompts are drawn, and sampled requests' seeds")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled arms")
    p.add_argument("--top-k", type=int, default=0, help="sampled arms: top-k (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampled arms: top-p (1: off)")
    p.add_argument(
        "--sampling-rule", choices=["coupled", "rejection"], help="instead of speculation.sampling_rule"
    )
    p.add_argument(
        "--no-grammar-drafts",
        action="store_true",
        help="guided requests (--workloads json): the drafter alone drafts, not the grammar's forced tokens",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load-memory", action="store_true", help="measure peak RSS while loading the pair")
    p.add_argument("--hf-reference", action="store_true", help="HF assisted generation, same pair/prompts")
    p.add_argument(
        "--anchor-llamacpp",
        type=Path,
        metavar="PATH",
        help="a llama-bench binary (scripts/llamacpp_anchor.sh builds one): llama.cpp on the same GGUF files",
    )
    p.add_argument(
        "--no-memory-floor",
        action="store_true",
        help="skip the memory rows (bytes a decode step reads, read bandwidth, figures against the floor)",
    )
    multi = p.add_argument_group("--workloads multiturn (bench/multiturn.py)")
    multi.add_argument("--turns", type=int, default=6, help="turns per conversation")
    multi.add_argument("--users", type=int, default=4, help="interleaved conversations")
    multi.add_argument("--system-tokens", type=int, default=300, help="a conversation's system prompt")
    multi.add_argument("--repeat-tokens", type=int, default=2000, help="the prompt sent twice")
    multi.add_argument(
        "--llama-server",
        type=Path,
        metavar="PATH",
        help="a llama-server binary (scripts/llamacpp_server.sh builds one): the same conversations there",
    )
    multi.add_argument("--llama-server-slots", type=int, default=1, help="its --parallel (default 1)")
    multi.add_argument("--kv-cache-mb", type=float, help="the target's KV pool instead of the config's")
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write speedup.png and acceptance.png there")
    return p


def _checked_flags(args: argparse.Namespace) -> tuple[list[int], list[int], set[str], list[str]]:
    """Concurrencies, ks, arm modes and workload names, each checked before anything loads."""
    concurrencies = parse_ints(args.concurrency, "--concurrency")
    ks = parse_ints(args.k, "--k")
    modes = {m.strip() for m in args.arms.split(",") if m.strip()}
    if not modes <= {"fixed", "adaptive"} or not modes:
        raise SystemExit("--arms: fixed, adaptive or fixed,adaptive")
    if args.num_prompts < 1 or args.max_tokens < 1 or args.repeats < 1:
        raise SystemExit("--num-prompts, --max-tokens and --repeats must be >= 1")
    if args.min_seconds < 0:
        raise SystemExit("--min-seconds must be >= 0")
    for flag, binary, script in (
        ("--anchor-llamacpp", args.anchor_llamacpp, "scripts/llamacpp_anchor.sh"),
        ("--llama-server", args.llama_server, "scripts/llamacpp_server.sh"),
    ):
        if binary is not None and not (binary.is_file() and os.access(binary, os.X_OK)):
            raise SystemExit(f"{flag}: no executable at {binary} ({script} builds one)")
    try:
        SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    except InvalidInputError as exc:
        raise SystemExit(f"--{exc.field.replace('_', '-')}: {exc}") from None
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if names == ["multiturn"]:
        if min(args.turns, args.users, args.system_tokens, args.repeat_tokens, args.llama_server_slots) < 1:
            raise SystemExit("--turns, --users, --system-tokens, --repeat-tokens, --llama-server-slots: >= 1")
        return concurrencies, ks, modes, names
    if not names or not set(names) <= set(workloads.WORKLOADS):
        raise SystemExit(
            f"--workloads: comma-separated names from {', '.join(workloads.WORKLOADS)}, or multiturn alone"
        )
    return concurrencies, ks, modes, names


def _pair(args: argparse.Namespace) -> tuple[SpecDecConfig, list[str]]:
    """The pair's config and the drafters to sweep (unknown names fail before anything loads)."""
    try:
        config = load_config(args.config)
        update: dict[str, Any] = {"sampling_rule": args.sampling_rule} if args.sampling_rule else {}
        if args.no_grammar_drafts:
            update["grammar_drafts"] = False
        if update:
            speculation = config.speculation.model_copy(update=update)
            config = config.model_copy(update={"speculation": speculation})
        if config.engine.kind != "torch":
            raise SystemExit("specdec-bench runs the torch engine (engine.kind: torch)")
        drafters = default_drafters(config)
        if args.drafters:
            drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
        for name in drafters:
            variant(config, name)  # unknown names fail before anything loads
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    return config, drafters


def _llamacpp_anchors(args: argparse.Namespace, config: SpecDecConfig) -> dict[str, Anchor]:
    """llama-bench on the target's and a model drafter's GGUF files, before anything of ours loads."""
    from trispec.bench.llamacpp import run_llama_bench

    files = {"target": resolve_checkpoint(config.target.checkpoint, "target.checkpoint")}
    if config.drafter.model is not None:
        files["draft"] = resolve_checkpoint(config.drafter.model.checkpoint, "drafter.model.checkpoint")
    anchors = {}
    for role, path in files.items():
        if path.suffix != ".gguf":
            raise SystemExit(f"--anchor-llamacpp: the {role} is not a GGUF file ({path})")
        try:
            anchors[role] = run_llama_bench(
                args.anchor_llamacpp, path, threads=args.threads, n_gen=args.max_tokens
            )
        except (OSError, RuntimeError) as exc:
            raise SystemExit(f"--anchor-llamacpp: {exc}") from None
    return anchors


def _sweep(
    args: argparse.Namespace,
    bench: Bench,
    loads: list[Workload],
    arms: list[Arm],
    concurrencies: list[int],
    reporter: Reporter,
    hf: dict[str, HFResult] | None,
    max_k: int,
) -> list[dict[str, Any]]:
    """Every workload, arm and concurrency: warm-up, the point's runs, a row each. ``json`` runs before
    ``json_free``, whose requests then stop at their guided answers' lengths (guided_vs_unguided)."""
    rows: list[dict[str, Any]] = []
    total = len(loads) * len(concurrencies) * len(arms) * args.num_prompts * args.repeats
    guided_lengths: list[int] | None = None
    with reporter.progress(total) as progress:
        for load in sorted(loads, key=lambda w: w.name == "json_free"):
            if load.name == "json_free" and guided_lengths is not None:
                load = dataclasses.replace(load, max_tokens=guided_lengths)
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
                    if load.name == "json_free" and load.max_tokens is not None:
                        r["guided_vs_unguided"] = _guided_vs_unguided(rows, r)
                    rows.append(r)
                    reporter.run_row(r)
                if load.name == "json" and guided_lengths is None:
                    # the same for every arm and batch (greedy or seeded): the first run's lengths
                    guided_lengths = [max(1, len(t)) for t in runs[arms[0].name][0].token_ids]
            if hf is not None:
                rows += reporter.hf_rows(load.name, hf[load.name], rows, max_k)
    return rows


def _guided_vs_unguided(rows: list[dict[str, Any]], unguided: dict[str, Any]) -> float | None:
    """The ``json`` row's tok/s over this ``json_free`` row's (same arm and concurrency)."""
    for r in rows:
        if r["workload"] == "json" and (r["arm"], r["concurrency"]) == (
            unguided["arm"],
            unguided["concurrency"],
        ):
            return round(r["tok_s"] / unguided["tok_s"], 4)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trispec.bench.report import Reporter

    concurrencies, ks, modes, names = _checked_flags(args)
    torch.set_num_threads(args.threads)
    config, drafters = _pair(args)
    if names == ["multiturn"]:
        from trispec.bench import multiturn

        return multiturn.run(args, config)
    arms = make_arms(drafters, ks, adaptive="adaptive" in modes, fixed="fixed" in modes)
    reporter = Reporter(json_lines=args.json)
    reporter.header(config, args, drafters)

    anchors = _llamacpp_anchors(args, config) if args.anchor_llamacpp else {}
    for role, anchor in anchors.items():
        reporter.llamacpp(role, anchor)

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

    sampling = None
    if args.temperature > 0:
        sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    try:  # what only the checkpoints tell (a draft vocabulary past the draft's) fails here, by name
        bench = Bench(config, max(concurrencies), longest + args.max_tokens, max(ks), sampling, args.seed)
        for name in drafters:  # builds each draft engine
            ratio = bench.draft_step_ratio(name)
            if ratio is not None:
                reporter.draft_cost(name, ratio)
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None

    rows = _sweep(args, bench, loads, arms, concurrencies, reporter, hf, max(ks))
    if len(loads) > 1:
        for r in combined_rows(rows):
            rows.append(r)
            reporter.run_row(r)
    reporter.summary(rows)
    if "target" in anchors:
        reporter.against_llamacpp(rows, anchors["target"])
    if not args.no_memory_floor and bench.target.model.embed.device.type == "cpu":  # CPU decoding's floor
        from trispec.bench.memory import memory_rows

        for r in memory_rows(bench, rows, anchors):
            reporter.memory_floor(r)
    if args.plot is not None:
        from trispec.bench.plots import write_plots

        for path in write_plots(rows, args.plot):
            reporter.note(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
