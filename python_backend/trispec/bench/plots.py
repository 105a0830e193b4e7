"""PNG plots of speculative-decoding benchmark results.

Input: result rows (dicts) with at least ``workload`` (str), ``concurrency`` (int), ``arm`` (``"plain"``,
``"<drafter>-k<N>"`` or ``"<drafter>-adaptive"``), ``tok_s``, ``speedup_vs_plain``, ``acceptance``,
``accepted_per_position`` (fraction of rounds in which draft position i was accepted) and
``identical_to_plain`` (bool or None). Several rows for the same point (repetitions) are averaged.

matplotlib is imported lazily (``pip install -e '.[bench]'``) and drives the Agg canvas directly
(``matplotlib.figure.Figure``, no pyplot): no display, no global backend state.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]

PLAIN = "plain"
CONCURRENCY_TICKS = (1, 2, 4, 8, 16)


def _figure(width: float, height: float, ncols: int = 1):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("plots need matplotlib: pip install 'matplotlib>=3.7' (or -e '.[bench]')") from exc
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _ordered(values: Iterable[str]) -> list[str]:
    """Unique values in first-seen order."""
    return list(dict.fromkeys(values))


def _arm_sort_key(arm: str) -> tuple[str, int, str]:
    # "<drafter>-k<N>" by drafter then N, "-adaptive" after the fixed ks of its drafter
    drafter, _, tail = arm.rpartition("-")
    if tail.startswith("k") and tail[1:].isdigit():
        return (drafter, int(tail[1:]), "")
    return (drafter or arm, 10**6, tail)


def _colours(arms: Sequence[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(arms) <= 10 else "tab20"]
    return {arm: cmap(i % cmap.N) for i, arm in enumerate(arms)}


def _no_data(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path


def plot_speedup(rows: Sequence[Row], path: str | Path) -> Path:
    """Speed-up over plain vs concurrency: a panel per workload, a line per (non-plain) arm.

    Points where some repetition's greedy output differed from plain (``identical_to_plain`` False)
    are marked with a red cross.
    """
    workloads = _ordered(str(r["workload"]) for r in rows) or ["(no rows)"]
    arms = sorted(_ordered(str(r["arm"]) for r in rows if r["arm"] != PLAIN), key=_arm_sort_key)
    colours = _colours(arms)
    fig, axes = _figure(max(5.0, 4.2 * len(workloads)), 4.2, len(workloads))

    concurrencies = sorted({int(r["concurrency"]) for r in rows if _number(r.get("concurrency"))})
    ticks = sorted(set(CONCURRENCY_TICKS) | set(concurrencies)) if concurrencies else list(CONCURRENCY_TICKS)
    y_lo, y_hi = 1.0, 1.0
    for ax, workload in zip(axes, workloads):
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain (1.0)")
        plotted = False
        for arm in arms:
            points: dict[int, list[float]] = defaultdict(list)
            differs: set[int] = set()
            for r in rows:
                if str(r["workload"]) != workload or r["arm"] != arm:
                    continue
                x, y = _number(r.get("concurrency")), _number(r.get("speedup_vs_plain"))
                if x is None or y is None or x <= 0:
                    continue
                points[int(x)].append(y)
                if r.get("identical_to_plain") is False:
                    differs.add(int(x))
            if not points:
                continue
            xs = sorted(points)
            ys = [sum(points[x]) / len(points[x]) for x in xs]
            y_lo, y_hi = min(y_lo, *ys), max(y_hi, *ys)
            ax.plot(xs, ys, marker="o", color=colours[arm], label=arm)
            bad = [(x, y) for x, y in zip(xs, ys) if x in differs]
            if bad:
                ax.plot(*zip(*bad), linestyle="none", marker="x", markersize=10, color="red", zorder=5)
            plotted = True
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
        ax.set_title(workload)
        ax.set_xlabel("concurrency")
        ax.grid(True, alpha=0.3)
        if not plotted:
            ax.text(0.5, 0.5, "no speculative arms", ha="center", va="center", transform=ax.transAxes)
    pad = 0.05 * max(y_hi - y_lo, 0.5)
    for ax in axes:
        ax.set_ylim(min(0.0, y_lo - pad), y_hi + pad)
    axes[0].set_ylabel("speed-up vs plain (×)")
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if any(r.get("identical_to_plain") is False for r in rows):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], linestyle="none", marker="x", color="red"))
        labels.append("output differs from plain")
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle("Speculative decoding: speed-up over plain decoding")
    return _save(fig, path)


def _mean_per_position(lists: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise mean; position i averages only the rows that have it (adaptive k varies)."""
    out: list[float] = []
    for i in range(max((len(v) for v in lists), default=0)):
        vals = [x for v in lists if i < len(v) and (x := _number(v[i])) is not None]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def plot_acceptance(rows: Sequence[Row], path: str | Path) -> Path:
    """Acceptance per draft position: a line per (workload, arm) of the drafting arms, taken at
    concurrency 1 where measured (else at that pair's lowest concurrency, noted in the label)."""
    groups: dict[tuple[str, str], dict[int, list[Sequence[float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        per_pos = r.get("accepted_per_position")
        conc = _number(r.get("concurrency"))
        if r["arm"] == PLAIN or not per_pos or conc is None:
            continue
        groups[(str(r["workload"]), str(r["arm"]))][int(conc)].append(per_pos)

    fig, (ax,) = _figure(7.5, 4.5)
    if not groups:
        _no_data(ax, "no drafting arms with accepted_per_position")
        return _save(fig, path)
    workloads = _ordered(w for w, _ in groups)
    arms = sorted(_ordered(a for _, a in groups), key=_arm_sort_key)
    colours = _colours(arms)
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v", "P"]
    k_max = 1
    for wi, workload in enumerate(workloads):
        for arm in arms:
            by_conc = groups.get((workload, arm))
            if not by_conc:
                continue
            conc = 1 if 1 in by_conc else min(by_conc)
            ys = _mean_per_position(by_conc[conc])
            if not ys:
                continue
            xs = list(range(1, len(ys) + 1))
            k_max = max(k_max, len(ys))
            label = f"{workload} · {arm}" + ("" if conc == 1 else f" (concurrency {conc})")
            ax.plot(
                xs,
                ys,
                color=colours[arm],
                linestyle=styles[wi % len(styles)],
                marker=markers[wi % len(markers)],
                label=label,
            )
    ax.set_xticks(range(1, k_max + 1))
    ax.set_xlim(0.7, k_max + 0.3)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("draft position")
    ax.set_ylabel("fraction of rounds accepted")
    ax.set_title("Acceptance per draft position (concurrency 1)")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    return _save(fig, path)


def write_plots(rows: Sequence[Row], out_dir: str | Path) -> list[Path]:
    """Write ``speedup.png`` and ``acceptance.png`` into ``out_dir``; return their paths."""
    rows = list(rows)
    if not rows:
        raise ValueError("no benchmark rows to plot")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [plot_speedup(rows, out / "speedup.png"), plot_acceptance(rows, out / "acceptance.png")]
