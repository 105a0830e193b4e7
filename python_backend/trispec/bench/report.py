"""What ``specdec-bench`` prints: tables (rich) or one JSON object per line, and its progress bar.

JSON lines carry ``"row"``: ``run`` (one arm at one workload and concurrency: ``workload``,
``concurrency``, ``arm``, ``tok_s``, ``speedup_vs_plain``, ``acceptance``, ``identical_to_plain`` and
more; Hugging Face reference arms too), ``draft_cost`` (a draft model's 1-token step over the
target's), ``load_memory`` (peak RSS while loading the pair against its weights), ``llamacpp``
(llama-bench's prompt and decode tok/s on a GGUF file of the pair), ``vs_llamacpp`` (each arm at one
request over llama.cpp's plain decoding of the target, end to end and decode only) and ``memory`` (per
model: the bytes a decode step reads, the machine's read bandwidth, the floor, every decode figure as a
fraction of it and the host time per token; ``bench/memory.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from trispec.bench.arms import PLAIN
from trispec.bench.hf_reference import HFResult
from trispec.bench.llamacpp import PROMPT_TOKENS, Anchor
from trispec.bench.load_memory import LoadMemory
from trispec.config import SpecDecConfig


class ProgressBar:
    """Requests done out of requests planned; the plan grows when a point runs more repeats
    (``--min-seconds``)."""

    def __init__(self, bar: Progress, task: TaskID) -> None:
        self.bar, self.task = bar, task

    def advance(self) -> None:
        self.bar.advance(self.task)

    def extend(self, requests: int) -> None:
        total = self.bar.tasks[self.task].total or 0
        self.bar.update(self.task, total=total + requests)


class Reporter:
    def __init__(self, json_lines: bool) -> None:
        self.json_lines = json_lines
        # wide enough for the tables when the output is a file or a pipe (rich's default there: 80)
        self.out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.err = Console(stderr=True, highlight=False)
        self.draft_costs: dict[str, float] = {}
        self.memory: LoadMemory | None = None

    def _emit(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    def note(self, text: str) -> None:
        (self.err if self.json_lines else self.out).print(text)

    def header(self, config: SpecDecConfig, args: argparse.Namespace, drafters: list[str]) -> None:
        if self.json_lines:
            return
        source = args.config or "built-in default (SmolLM2-135M-Instruct)"
        sampling = "greedy"
        if args.temperature > 0:
            sampling = (
                f"sampled T {args.temperature} top-k {args.top_k} top-p {args.top_p} "
                f"({config.speculation.sampling_rule} rule, seeded)"
            )
        self.out.print(
            f"specdec-bench: {source}; target {config.target.dtype}; drafters {', '.join(drafters)}; "
            f"k {args.k}; {args.num_prompts} requests x {args.max_tokens} tokens per point; {sampling}; "
            f"{args.threads} threads"
        )

    def load_memory(self, memory: LoadMemory) -> None:
        self.memory = memory
        if self.json_lines:
            self._emit({"row": "load_memory", **memory.to_dict()})
            return
        m = memory.to_dict()
        self.out.print(
            f"load memory ({m['measured_by']}): peak RSS {m['peak_load_rss_gib']:.2f} GiB = "
            f"{m['peak_vs_weights']:.2f}x the weights held ({m['weights_gib']:.2f} GiB); "
            f"also resident: KV pools {m['kv_gib']:.2f} GiB, runtime {m['runtime_gib']:.2f} GiB; "
            f"loading transient {m['load_transient_gib']:.2f} GiB"
        )

    def draft_cost(self, drafter: str, ratio: float) -> None:
        self.draft_costs[drafter] = ratio
        if self.json_lines:
            self._emit({"row": "draft_cost", "drafter": drafter, "draft_vs_target_step": round(ratio, 4)})
        else:
            self.out.print(f"draft step / target step (1 token, batch 1): {drafter} {ratio:.3f}")

    @contextlib.contextmanager
    def progress(self, total: int) -> Iterator[ProgressBar]:
        bar = Progress(
            TextColumn("requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
            disable=not sys.stderr.isatty(),
        )
        with bar:
            yield ProgressBar(bar, bar.add_task("bench", total=total))

    def run_row(self, row: dict[str, Any]) -> None:
        if self.json_lines:
            self._emit({"row": "run", **{k: v for k, v in row.items() if k != "token_ids"}})

    def hf_rows(self, workload: str, hf: HFResult, rows: list[dict[str, Any]], k: int) -> list[dict]:
        """The reference arms as rows, against our plain arm at concurrency 1."""
        ours = {r["arm"]: r for r in rows if r["workload"] == workload and r["concurrency"] == 1}
        plain = ours.get(PLAIN)
        out = []
        for arm, seconds, token_ids in (
            ("hf-plain", hf.plain_s, hf.plain_token_ids),
            (f"hf-assisted-k{k}", hf.assisted_s, hf.assisted_token_ids),
        ):
            tokens = sum(len(t) for t in token_ids)
            tok_s = tokens / seconds
            r: dict[str, Any] = {
                "workload": workload,
                "concurrency": 1,
                "arm": arm,
                "drafter": "hf" if arm != "hf-plain" else None,
                "k": k if arm != "hf-plain" else 0,
                "adaptive": False,
                "requests": len(token_ids),
                "tokens": tokens,
                "seconds": round(seconds, 4),
                "tok_s": round(tok_s, 3),
                "speedup_vs_plain": round(tok_s / plain["tok_s"], 4) if plain else None,
                "acceptance": None,
                "identical_to_plain": token_ids == plain["token_ids"] if plain else None,
                "transformers": hf.transformers_version,
            }
            if arm != "hf-plain":
                r["speedup_vs_hf_plain"] = round(hf.plain_s / seconds, 4)
                r["ours_vs_this"] = {
                    name: round(o["tok_s"] / tok_s, 3) for name, o in ours.items() if name != PLAIN
                }
            out.append(r)
            self.run_row(r)
        return out

    def llamacpp(self, role: str, anchor: Anchor) -> None:
        row = anchor.row(role)
        if self.json_lines:
            self._emit(row)
            return
        self.out.print(
            f"llama.cpp {anchor.build} ({role}, {anchor.model.name}): pp{row['pp_tokens']} "
            f"{anchor.prompt_tok_s:.1f} tok/s, tg{anchor.n_gen} {anchor.decode_tok_s:.1f} tok/s"
        )

    def against_llamacpp(self, rows: list[dict[str, Any]], anchor: Anchor) -> None:
        """Each arm at one request against llama.cpp's plain decoding of the target: end to end, and
        decode only (first-token time out), and our time to a first token against its prompt speed."""
        out = []
        for r in rows:
            if r["concurrency"] != 1 or r.get("decode_tok_s") is None:
                continue
            ttft = (r.get("ttft_s") or {}).get("p50")
            out.append({
                "row": "vs_llamacpp", "workload": r["workload"], "arm": r["arm"],
                "tok_s_vs_tg": round(r["tok_s"] / anchor.decode_tok_s, 3),
                "decode_tok_s_vs_tg": round(r["decode_tok_s"] / anchor.decode_tok_s, 3),
                "ttft_p50_s": ttft,
            })  # fmt: skip
        if self.json_lines:
            for o in out:
                self._emit(o)
            return
        table = Table(
            title=f"against llama.cpp tg{anchor.n_gen} {anchor.decode_tok_s:.1f} tok/s", title_justify="left"
        )
        for column in ("workload", "arm", "end to end", "decode only", "TTFT p50 ms"):
            table.add_column(column, justify="left" if column in ("workload", "arm") else "right")
        for o in out:
            ttft = "" if o["ttft_p50_s"] is None else f"{o['ttft_p50_s'] * 1000:.0f}"
            table.add_row(
                o["workload"], o["arm"], f"{o['tok_s_vs_tg']:.2f}x", f"{o['decode_tok_s_vs_tg']:.2f}x", ttft
            )
        self.out.print(table)
        pp_ms = 1000 * PROMPT_TOKENS / anchor.prompt_tok_s
        pp = f"llama.cpp's pp{PROMPT_TOKENS}: {anchor.prompt_tok_s:.1f} tok/s"
        self.out.print(f"{pp} ({pp_ms:.0f} ms to a first token)")

    def memory_floor(self, row: dict[str, Any]) -> None:
        if self.json_lines:
            self._emit(row)
            return
        mb = {k: f"{v / 1e6:.1f}" for k, v in row["bytes"].items() if k != "total"}
        self.out.print(
            f"memory floor, {row['role']}: {row['bytes']['total'] / 1e6:.1f} MB a step "
            f"({', '.join(f'{k} {v}' for k, v in mb.items())} MB) at {row['read_gb_s']:.1f} GB/s read "
            f"(torch.sum, this run) = {row['floor_ms']:.2f} ms, {row['floor_tok_s']:.1f} tok/s"
        )
        table = Table(title=f"decode against the floor ({row['role']})", title_justify="left")
        for column in ("figure", "tok/s", "ms a token", "of floor"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        for name, f in row["figures"].items():
            table.add_row(name, f"{f['tok_s']:.1f}", f"{f['ms']:.2f}", f"{f['of_floor']:.2f}")
        self.out.print(table)
        for workload, h in (row.get("host") or {}).items():
            self.out.print(
                f"host time per token ({workload}, plain, one request): {h['host_ms']:.2f} ms "
                f"= {h['token_ms']:.2f} ms a token - {h['kernel_ms']:.2f} ms in kernels"
            )

    def summary(self, rows: list[dict[str, Any]]) -> None:
        if self.json_lines:
            return
        for workload in dict.fromkeys(r["workload"] for r in rows):
            table = Table(title=f"workload {workload}", title_justify="left")
            for column in ("conc", "arm", "tok/s", "vs plain", "accept", "mean k", "TTFT p50/p99 ms",
                           "ITL p50/p99 ms", "same"):  # fmt: skip
                table.add_column(column, justify="left" if column in ("arm", "same") else "right")
            for r in rows:
                if r["workload"] != workload:
                    continue
                ttft, itl = r.get("ttft_s") or {}, r.get("itl_s") or {}
                table.add_row(
                    str(r["concurrency"]),
                    r["arm"],
                    _tok_s(r),
                    "" if r["speedup_vs_plain"] is None else f"{r['speedup_vs_plain']:.2f}x",
                    "" if r["acceptance"] is None else f"{r['acceptance']:.0%}",
                    "" if r.get("mean_k") is None or r["drafter"] is None else f"{r['mean_k']:.2f}",
                    _pair_ms(ttft),
                    _pair_ms(itl),
                    {True: "yes", False: "NO", None: ""}[r["identical_to_plain"]],
                )
            self.out.print(table)
            ratios = [r for r in rows if r["workload"] == workload and r.get("guided_vs_unguided")]
            if ratios:
                each = ", ".join(
                    f"{r['arm']} @{r['concurrency']} {r['guided_vs_unguided']:.2f}x" for r in ratios
                )
                self.out.print(
                    "guided (json) over unguided tok/s, each unguided request as long as its guided "
                    f"answer: {each}"
                )
            for r in rows:
                if r["workload"] == workload and "ours_vs_this" in r:
                    best = ", ".join(f"{a} {v:.2f}x" for a, v in r["ours_vs_this"].items())
                    self.out.print(f"ours vs {r['arm']} (transformers {r['transformers']}): {best}")


def _tok_s(r: dict[str, Any]) -> str:
    """tok/s, and with repeats the range of the arm's own runs: the noise to read ratios against."""
    runs = r.get("tok_s_runs") or []
    if len(runs) < 2:
        return f"{r['tok_s']:.1f}"
    return f"{r['tok_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def _pair_ms(p: dict[str, float | None]) -> str:
    if not p or p.get("p50") is None:
        return ""
    return f"{p['p50'] * 1000:.0f}/{p['p99'] * 1000:.0f}"  # type: ignore[operator]
