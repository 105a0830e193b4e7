"""What ``specdec-bench-served`` prints: a header (date, machine, commit, command), then a rich table of
the arms and one of the ratios; or, with ``--json``, one JSON object per line (``row``:
``served_header``, ``served`` per arm, ``served_ratios`` per workload and client count)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def _x(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:+.2f}"


def _tok_s(row: dict[str, Any]) -> str:
    """tok/s, and with repeats the range of the arm's own runs: the noise ratios are read against."""
    runs = row.get("tok_s_runs") or []
    if len(runs) < 2:
        return f"{row['tok_s']:.1f}"
    return f"{row['tok_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


class ServedReporter:
    def __init__(self, json_lines: bool) -> None:
        self.json_lines = json_lines
        # wide enough for the tables when the output is a file or a pipe (rich's default there: 80)
        self.out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.err = Console(stderr=True, highlight=False)

    def _emit(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    def note(self, text: str) -> None:
        """Progress and notices: on stderr, so --json output stays JSON."""
        self.err.print(text)

    def header(self, info: dict[str, Any]) -> None:
        if self.json_lines:
            self._emit({"row": "served_header", **info})
            return
        isa = ", ".join(info["isa"]) or "no AVX2"
        self.out.print(
            f"specdec-bench-served {info['date']} · {info['cpu']} ({isa}; "
            f"torch {info['torch_cpu_capability']}) · {info['threads']} threads · commit {info['commit']}"
        )
        self.out.print(
            f"config {info['config']}; {info['num_prompts']} prompts per workload x {info['max_tokens']} "
            f"tokens, greedy, end token ignored; clients {info['clients']}; {info['repeats']} repeat(s)"
        )
        if info.get("llama_server"):
            draft = f", -md {info['draft_file']}" if info.get("draft_file") else ""
            self.out.print(f"llama-server {info['llama_server']} on {info['target_file']}{draft}")
        self.out.print(f"command: {info['command']}")

    def arm(self, row: dict[str, Any]) -> None:
        if self.json_lines:
            self._emit(row)

    def ratios(self, row: dict[str, Any]) -> None:
        if self.json_lines:
            self._emit(row)

    def tables(self, rows: Sequence[dict[str, Any]], ratios: Sequence[dict[str, Any]]) -> None:
        if self.json_lines:
            return
        table = Table(title="served, one OpenAI client for every arm", title_justify="left")
        for column in ("workload", "clients", "arm", "tok/s", "decode tok/s a stream", "ms a token",
                       "TTFT p50 ms"):  # fmt: skip
            table.add_column(column, justify="left" if column in ("workload", "arm") else "right")
        for r in rows:
            table.add_row(
                r["workload"], str(r["clients"]), r["arm"], _tok_s(r), f"{r['decode_tok_s']:.1f}",
                f"{r['ms_per_token']:.2f}", f"{r['ttft_p50_s'] * 1000:.0f}",
            )  # fmt: skip
        self.out.print(table)
        table = Table(title="ratios, same run (tok/s; served/offline: decode a stream)", title_justify="left")
        for column in ("workload", "clients", "ours / llama-server", "ours plain / llama-server",
                       "ours / ours plain", "-md / llama-server", "served / offline", "overhead ms",
                       "served / offline plain", "overhead ms plain"):  # fmt: skip
            table.add_column(column, justify="left" if column == "workload" else "right")
        for r in ratios:
            table.add_row(
                r["workload"], str(r["clients"]), _x(r["ours_vs_llama_server"]),
                _x(r["ours_plain_vs_llama_server"]), _x(r["ours_vs_ours_plain"]),
                _x(r["llama_server_md_vs_plain"]), _x(r["served_vs_offline"]), _ms(r["overhead_ms"]),
                _x(r["served_vs_offline_plain"]), _ms(r["overhead_ms_plain"]),
            )  # fmt: skip
        self.out.print(table)
