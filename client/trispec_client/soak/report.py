"""What a soak run found: one check per line of the table, the figures behind them, and how they are
printed (a rich table, or one JSON object with ``--json``)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Check:
    phase: str
    name: str
    passed: bool | None  # None: skipped (not counted as a failure)
    value: str
    limit: str = ""


@dataclass
class Outcome:
    """What became of one request, seen from the client."""

    kind: str = "completed"  # completed | refused | error | hung | cancelled
    text: str = ""
    chunks: int = 0
    tokens: int = 0
    ttft_s: float | None = None
    total_s: float = 0.0
    max_gap_s: float = 0.0
    finish_reason: str | None = None
    message: str = ""
    status: str | None = None
    http_status: int | None = None
    # times the client resumed it after the server cut it, and the seed it sampled with (if sampled)
    resumed: int = 0
    seed: int | None = None


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(self, phase: str, name: str, passed: bool | None, value: object, limit: object = "") -> None:
        self.checks.append(Check(phase, name, passed, str(value), str(limit)))

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)


def render(report: Report, out: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="specdec soak", show_lines=False)
    for column in ("phase", "check", "result", "value", "limit"):
        table.add_column(column, overflow="fold")
    for c in report.checks:
        result = "[green]PASS" if c.passed else "[yellow]SKIP" if c.passed is None else "[red]FAIL"
        table.add_row(c.phase, c.name, result, c.value, c.limit)
    console = Console(file=out, width=160)
    console.print(table)
    console.print(
        "[green]PASS" if report.passed else "[red]FAIL",
        f"({sum(c.passed is False for c in report.checks)} failed)",
    )


def finish(report: Report, as_json: bool) -> None:
    if as_json:
        print(
            json.dumps(
                {
                    "passed": report.passed,
                    "checks": [asdict(c) for c in report.checks],
                    "figures": report.figures,
                }
            )
        )
    else:
        render(report, sys.stdout)
