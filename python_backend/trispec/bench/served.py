"""``specdec-bench-served``: our served stack against llama.cpp's ``llama-server``, in one run, through
one OpenAI client.

Starts ``specdec-serve --config C`` and ``specdec-openai`` in front of it on free ports, and (with
``--llama-server PATH``, ``scripts/llamacpp_server.sh`` builds it) llama-server on the config's target
GGUF file with the same thread count: plain (``-np N`` for N clients) and, when the config's drafter is
a GGUF model, with that file as its draft (``-md``, 4 drafted tokens). Every arm gets the same prompts
(HumanEval and ShareGPT, the target's chat template, as token ids) through the same streamed
``/v1/completions`` client, greedy, ``--max-tokens`` each with the end token ignored, closed loop with N
clients for each N of ``--clients``. Ours runs twice: the config's defaults (speculative) and plain
(``num_draft_tokens: 0``); the same config also runs offline in this process (``SpeculativeLLM``,
loaded once, same prompts, k 0 and the default), for the served/offline ratio and the serving overhead
per token. Arms run in alternating order (reversed every other repeat) so drift hits all.

Every prompt is computed in full by every arm: our server and the offline engine run the config with
``scheduler.prefix_caching: false`` and llama-server with ``--no-cache-prompt`` (the same prompts are
sent to each arm and repeat; a cache would hand later arms their prompts for free).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from trispec.bench import workloads
from trispec.bench.llama_server import LlamaServer
from trispec.bench.machine import machine
from trispec.bench.served_arms import arms, run_point
from trispec.bench.served_figures import ALL, PEER_DRAFT, PEER_PLAIN, arm_rows, ratio_row
from trispec.bench.served_loop import ArmRun
from trispec.bench.served_report import ServedReporter
from trispec.bench.served_stack import OurStack
from trispec.checkpoints import load_tokenizer, resolve_checkpoint
from trispec.config import SpecDecConfig, load_config
from trispec.errors import ConfigError

WORKLOADS = ("humaneval", "sharegpt")
WARMUP_PROMPTS = 2  # per workload, untimed, before each client count's timed runs
WARMUP_TOKENS = 32
PEER_DRAFT_TOKENS = 4  # the llama-server -md arm: 4 drafted tokens


def parse_clients(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--clients: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit("--clients: every value must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec-bench-served", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", type=Path, help="the YAML to serve (default: the built-in SmolLM2 config)")
    p.add_argument("--workloads", default="humaneval,sharegpt", help="comma-separated: humaneval, sharegpt")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts per workload (default 4)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per answer, end token ignored")
    p.add_argument("--clients", default="1,4", help="closed-loop clients, comma-separated (default 1,4)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per arm, in alternating order")
    p.add_argument("--threads", type=int, default=2, help="threads of every arm (ours: num_threads)")
    p.add_argument("--seed", type=int, default=0, help="which prompts are drawn")
    p.add_argument(
        "--llama-server",
        type=Path,
        metavar="PATH",
        help="a llama-server binary (scripts/llamacpp_server.sh builds one); without it only our arms run",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    return p


def _checked(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    clients = parse_clients(args.clients)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not names or not set(names) <= set(WORKLOADS):
        raise SystemExit(f"--workloads: comma-separated names from {', '.join(WORKLOADS)}")
    if args.num_prompts < 1 or args.repeats < 1 or args.threads < 1:
        raise SystemExit("--num-prompts, --repeats and --threads must be >= 1")
    if args.max_tokens < 2:
        raise SystemExit("--max-tokens must be >= 2 (decode speed is measured after the first token)")
    binary = args.llama_server
    if binary is not None and not (binary.is_file() and os.access(binary, os.X_OK)):
        raise SystemExit(f"--llama-server: no executable at {binary} (scripts/llamacpp_server.sh builds one)")
    return clients, names


def served_config(config: SpecDecConfig, threads: int) -> SpecDecConfig:
    """The config as the bench serves and runs it: every prompt computed (no prefix cache: the same
    prompts go to every arm), ``threads`` threads."""
    scheduler = config.scheduler.model_copy(update={"prefix_caching": False})
    return config.model_copy(update={"scheduler": scheduler, "num_threads": threads})


def write_config(config: SpecDecConfig, path: Path) -> Path:
    """``config`` as a YAML file (its checkpoint paths are absolute once loaded)."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def gguf_files(config: SpecDecConfig) -> tuple[Path, Path | None]:
    """The target's GGUF file and the draft model's where the drafter is a GGUF model (else None)."""
    target = resolve_checkpoint(config.target.checkpoint, "target.checkpoint")
    if target.suffix != ".gguf":
        raise SystemExit(f"--llama-server: the target is not a GGUF file ({target})")
    draft = None
    if config.drafter.kind == "model" and config.drafter.model is not None:
        path = resolve_checkpoint(config.drafter.model.checkpoint, "drafter.model.checkpoint")
        draft = path if path.suffix == ".gguf" else None
    return target, draft


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the servers as Ctrl-C does


@contextlib.contextmanager
def _peers(
    args: argparse.Namespace, target: Path, draft: Path | None, slots: int, context: int
) -> Iterator[dict[str, LlamaServer]]:
    """llama-server plain and with the draft (where there is one), ``slots`` slots, for the block."""
    with contextlib.ExitStack() as stack:
        servers: dict[str, LlamaServer] = {}
        if args.llama_server is not None:
            start = functools.partial(
                LlamaServer, args.llama_server, target, threads=args.threads, slots=slots, context=context,
                cache_prompt=False,
            )  # fmt: skip
            servers[PEER_PLAIN] = start()
            stack.callback(servers[PEER_PLAIN].close)
            if draft is not None:
                servers[PEER_DRAFT] = start(draft=draft, draft_max=PEER_DRAFT_TOKENS)
                stack.callback(servers[PEER_DRAFT].close)
        yield servers


def _run(
    args: argparse.Namespace,
    config: SpecDecConfig,
    work: Path,
    loads: list[workloads.Workload],
    clients: list[int],
    target: Path | None,
    draft: Path | None,
    reporter: ServedReporter,
) -> list[dict[str, Any]]:
    """Every arm at every client count and workload; the arms' rows."""
    from trispec.llm import SpeculativeLLM

    model = config.serving.model_name
    runs: dict[tuple[str, int, str], list[ArmRun]] = {}
    with OurStack(write_config(config, work / "config.yaml"), model, work / "ours") as ours:
        reporter.note(f"ours: {ours.url} (logs in {work / 'ours'}); loading the offline engine")
        engine = SpeculativeLLM.from_config(config).engine
        for n in clients:
            with _peers(args, target, draft, n, config.scheduler.max_context or 4096) as peers:
                name = target.name if target is not None else ""
                point_arms = arms(ours.url, model, engine, {arm: (p.url, name) for arm, p in peers.items()})
                for load in loads:
                    point = run_point(
                        point_arms, load, n, repeats=args.repeats, max_tokens=args.max_tokens,
                        warmup_tokens=WARMUP_TOKENS, note=reporter.note,
                    )  # fmt: skip
                    for arm, arm_runs in point.items():
                        runs[(load.name, n, arm)] = arm_runs
    return arm_rows(runs, [w.name for w in loads], clients)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    clients, names = _checked(args)
    try:
        config = served_config(load_config(args.config), args.threads)
    except ConfigError as exc:
        raise SystemExit(f"config error: {exc}") from None
    if config.engine.kind != "torch":
        raise SystemExit("specdec-bench-served runs the torch engine (engine.kind: torch)")
    target, draft = gguf_files(config) if args.llama_server is not None else (None, None)
    reporter = ServedReporter(json_lines=args.json)
    tokenizer = load_tokenizer(config.target, "target")
    max_context = config.scheduler.max_context or 4096
    max_prompt = max_context - args.max_tokens - config.scheduler.max_num_draft_tokens - 1
    try:
        loads = workloads.load_workloads(
            names, tokenizer, args.num_prompts, WARMUP_PROMPTS, args.seed, max_prompt
        )
    except workloads.WorkloadDataMissing as exc:
        raise SystemExit(f"workload data: {exc}") from None
    info: dict[str, Any] = {
        **machine(args.threads),
        "config": str(args.config or "built-in default (SmolLM2-135M-Instruct)"),
        "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "clients": clients,
        "repeats": args.repeats, "llama_server": str(args.llama_server or ""),
        "target_file": str(target or ""), "draft_file": str(draft or ""),
        "command": shlex.join(["specdec-bench-served", *(sys.argv[1:] if argv is None else argv)]),
    }  # fmt: skip
    reporter.header(info)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="specdec-bench-served-") as work:
            rows = _run(args, config, Path(work), loads, clients, target, draft, reporter)
    except KeyboardInterrupt:
        reporter.note("interrupted: the servers were stopped")
        return 130
    except (RuntimeError, OSError) as exc:  # a server that would not start or answered an error
        reporter.note(f"specdec-bench-served: error: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    for row in rows:
        reporter.arm(row)
    ratios = [
        ratio_row(rows, workload, n)
        for n in clients
        for workload in dict.fromkeys(r["workload"] for r in rows)
    ]
    for r in ratios:
        reporter.ratios(r)
    reporter.tables(sorted(rows, key=lambda r: (r["clients"], r["workload"] == ALL, r["workload"])), ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
