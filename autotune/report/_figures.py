"""The report's figures, drawn with matplotlib's Agg backend into PNG bytes (no display, no pyplot)."""

from __future__ import annotations

import io

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from autotune.records import Machine
from autotune.report._data import (
    CATEGORIES,
    MemoryBar,
    StepSplit,
    SuggestionRow,
    TrialPoint,
    pareto_front,
)

COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_states": "#55a868",
    "activations": "#c44e52",
    "other": "#8c8c8c",
    "total": "#b0b0b0",
}
PHASE_COLORS = ["#8172b3", "#4c72b0", "#c44e52", "#55a868", "#b0b0b0"]
MAX_LABELLED = 40
"""Trial numbers are written beside the points up to this many trials; past it they clutter."""
OUTCOME_STYLE = {
    "ok": {"marker": "o", "color": "#4c72b0"},
    "oom": {"marker": "x", "color": "#c44e52"},
    "timeout": {"marker": "v", "color": "#dd8452"},
    "crash": {"marker": "X", "color": "#555555"},
    "pruned": {"marker": "s", "color": "#8172b3"},
}


def byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit an axis reaching ``largest`` bytes reads best in, and its size."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if largest >= size:
            return name, float(size)
    return "B", 1.0


def to_png(fig: Figure) -> bytes:
    """Render a figure to PNG bytes; no timestamp is written, so equal figures give equal bytes."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def memory_figure(bars: list[MemoryBar], budget: int | None) -> Figure:
    """Stacked bars of memory by category, peaks as diamonds, the device budget as a dashed line."""
    fig = Figure(figsize=(max(6.0, 1.5 * len(bars) + 3.5), 4.4), layout="constrained")
    ax = fig.add_subplot()
    peaks = [
        p for b in bars for p in (b.height, b.predicted_peak, b.measured_peak) if p is not None
    ]
    unit, size = byte_unit(max([*peaks, budget or 0, 1]))
    positions = list(range(len(bars)))
    for category in (*CATEGORIES, "total"):
        heights = [_part(bar, category) / size for bar in bars]
        if any(heights):
            bottoms = [_below(bar, category) / size for bar in bars]
            hatch = "//" if category == "total" else None
            label = "total (no split)" if category == "total" else category.replace("_", " ")
            ax.bar(
                positions,
                heights,
                bottom=bottoms,
                color=COLORS[category],
                label=label,
                hatch=hatch,
                width=0.6,
            )
    _peak_markers(ax, bars, size)
    ax.set_xlim(
        -0.5 - max(0.0, 1.5 - len(bars) / 2), len(bars) - 0.5 + max(0.0, 1.5 - len(bars) / 2)
    )
    if budget is not None:
        ax.axhline(
            budget / size,
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=f"device budget {budget / size:.2f} {unit}",
        )
    ax.set_xticks(positions, [_tick(bar) for bar in bars], fontsize=7)
    ax.set_ylabel(f"memory per device ({unit})")
    ax.set_title("Memory live at each plan's peak, by category (bars end at the peak)", fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _peak_markers(ax: Axes, bars: list[MemoryBar], size: float) -> None:
    kinds = (
        ("measured_peak", "black", "measured peak"),
        ("predicted_peak", "white", "predicted peak"),
    )
    for attr, face, label in kinds:
        xs = [x for x, bar in enumerate(bars) if getattr(bar, attr) is not None]
        if xs:
            ys = [getattr(bars[x], attr) / size for x in xs]
            ax.plot(
                xs,
                ys,
                marker="D",
                markerfacecolor=face,
                markeredgecolor="black",
                linestyle="none",
                label=label,
                zorder=3,
            )
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(
                    f"{y:.2f}",
                    (x, y),
                    ha="left",
                    va="center",
                    fontsize=7,
                    xytext=(6, 0),
                    textcoords="offset points",
                )


def _tick(bar: MemoryBar) -> str:
    """The bar's role, the plan it stands for and its ranks, then its source, a few short lines."""
    lines = [bar.label]
    if bar.plan is not None:
        lines += _wrap_commas(bar.plan, 24)
    if bar.ranks is not None:
        lines.append(f"{bar.ranks} rank{'s' if bar.ranks != 1 else ''}")
    return "\n".join([*lines, f"({_wrap(bar.source)})"])


def _wrap_commas(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for part in text.split(","):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += "," + part
        else:
            lines.append(part)
    return lines


def _wrap(text: str) -> str:
    return text.replace(" + ", "\n+ ").replace(", split at", ",\nsplit at").replace("; ", ";\n")


def _part(bar: MemoryBar, category: str) -> float:
    if category == "total":
        return float(bar.total or 0) if not bar.parts else 0.0
    return float(bar.parts.get(category, 0))


def _below(bar: MemoryBar, category: str) -> float:
    if category == "total":
        return 0.0
    index = CATEGORIES.index(category)
    return float(sum(bar.parts.get(name, 0) for name in CATEGORIES[:index]))


def block_figure(rows: list[tuple[str, int]]) -> Figure:
    """Horizontal bars: activation bytes saved for backward in each module, top to bottom."""
    fig = Figure(figsize=(7.0, max(2.0, 0.28 * len(rows) + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    unit, size = byte_unit(max(value for _, value in rows))
    ax.barh(range(len(rows)), [value / size for _, value in rows], color=COLORS["activations"])
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"activations saved for backward ({unit}, measured)")
    ax.set_title("Activations per block")
    return fig


def step_figure(split: StepSplit) -> Figure:
    """One horizontal stacked bar of the step's phases, each labelled with its share."""
    fig = Figure(figsize=(8.0, 2.2), layout="constrained")
    ax = fig.add_subplot()
    phases = {**split.phases, "other": split.other}
    left = 0.0
    for color, (name, seconds) in zip(PHASE_COLORS, phases.items(), strict=False):
        ax.barh(
            [0], [seconds * 1e3], left=[left], color=color, label=f"{name} {seconds * 1e3:.1f} ms"
        )
        share = seconds / split.step if split.step > 0 else 0.0
        if share >= 0.06:
            ax.text(
                left + seconds * 5e2,
                0,
                f"{share:.0%}",
                ha="center",
                va="center",
                color="white",
                fontsize=9,
            )
        left += seconds * 1e3
    ax.set_yticks([])
    ax.set_xlabel("milliseconds per step (median, measured)")
    ax.set_title(f"Step-time split: {split.step * 1e3:.1f} ms per step")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def trials_figure(
    trials: list[TrialPoint], budget: int | None, margin: float | None = None
) -> Figure:
    """Peak memory against throughput; failed trials sit on the zero line, the Pareto front
    ringed and joined; the budget and its usable part (budget x (1 - margin)) as lines."""
    fig = Figure(figsize=(8.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    placed = [t for t in trials if t.peak_memory_bytes is not None]
    unit, size = byte_unit(max([t.peak_memory_bytes or 0 for t in placed] + [budget or 0, 1]))
    for outcome, style in OUTCOME_STYLE.items():
        group = [t for t in placed if t.outcome == outcome]
        if group:
            xs = [(t.peak_memory_bytes or 0) / size for t in group]
            ys = [t.samples_per_s or 0.0 for t in group]
            label = f"{outcome} ({len(group)})"
            # Failed trials sit on y = 0: unclipped, so their markers show whole.
            ax.scatter(
                xs,
                ys,
                label=label,
                s=36,
                marker=style["marker"],
                color=style["color"],
                clip_on=False,
                zorder=3,
            )
            for trial, x, y in (
                zip(group, xs, ys, strict=True) if len(placed) <= MAX_LABELLED else ()
            ):
                ax.annotate(
                    f"#{trial.number}",
                    (x, y),
                    fontsize=7,
                    xytext=(4, 3),
                    textcoords="offset points",
                )
    front = pareto_front(trials)
    if front:
        ax.plot(
            [(t.peak_memory_bytes or 0) / size for t in front],
            [t.samples_per_s or 0.0 for t in front],
            drawstyle="steps-post",
            marker="o",
            markersize=11,
            markerfacecolor="none",
            markeredgewidth=1.4,
            color="#c44e52",
            linewidth=1.2,
            label=f"Pareto front ({len(front)} trial{'s' if len(front) != 1 else ''})",
            zorder=4,
            gid="pareto-front",
        )
    if budget is not None:
        ax.axvline(
            budget / size,
            color="black",
            linestyle="--",
            linewidth=1.0,
            label=f"device budget {budget / size:.2f} {unit}",
            gid="budget",
        )
        if margin is not None:
            usable = Machine(device_memory=budget, margin=margin).usable or 0.0
            ax.axvline(
                usable / size,
                color="#55a868",
                linestyle=":",
                linewidth=1.4,
                label=f"usable {usable / size:.2f} {unit} = budget x (1 - {margin:g})",
                gid="usable",
            )
    unplaced = len(trials) - len(placed)
    note = f" ({unplaced} trial(s) without a measured peak not shown)" if unplaced else ""
    ax.set_xlabel(f"peak memory per device ({unit}; measured, pruned plans: predicted)")
    ax.set_ylabel("throughput (samples/s, measured; 0 = failed)")
    ax.set_title(f"Trials: peak memory against throughput{note}", fontsize=9)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    return fig


def changes_figure(rows: list[SuggestionRow]) -> Figure:
    """Predicted against measured step-time ratio of each change; < 1 is faster."""
    fig = Figure(figsize=(7.0, max(2.2, 0.55 * len(rows) + 1.3)), layout="constrained")
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    measured = any(r.measured_ratio is not None for r in rows)
    shift = 0.18 if measured else 0.0
    predicted = [_or_nan(r.predicted_ratio) for r in rows]
    ax.barh([y - shift for y in ys], predicted, height=0.34, color="#b0b0b0", label="predicted")
    if measured:
        ax.barh([y + shift for y in ys], [_or_nan(r.measured_ratio) for r in rows], height=0.34,
                color="#4c72b0", xerr=_interval_errors(rows), capsize=3,
                label="measured (interval over repeats)")  # fmt: skip
    ax.axvline(1.0, color="black", linewidth=1.0)
    kept = {True: " (kept)", False: " (rejected)", None: ""}
    ax.set_yticks(ys, [f"{r.rule}{kept[r.kept]}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time after / before (< 1 is faster)")
    title = (
        "What each change did to the step time"
        if measured
        else "Predicted step time of each change (not yet measured)"
    )
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _interval_errors(rows: list[SuggestionRow]) -> list[list[float]]:
    """Error-bar lengths below and above each measured ratio (0 where none was measured)."""
    low, high = [], []
    for r in rows:
        ratio, interval = r.measured_ratio, r.measured_interval
        ok = ratio is not None and interval is not None
        low.append(ratio - interval[0] if ok else 0.0)  # type: ignore[index,operator]
        high.append(interval[1] - ratio if ok else 0.0)  # type: ignore[index,operator]
    return [low, high]


def importance_figure(importances: dict[str, float]) -> Figure:
    """Horizontal bars of Optuna's parameter importances, largest first."""
    rows = sorted(importances.items(), key=lambda item: item[1], reverse=True)
    fig = Figure(figsize=(6.0, max(2.0, 0.35 * len(rows) + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(range(len(rows)), [value for _, value in rows], color="#4c72b0")
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("importance (Optuna's default PED-ANOVA evaluator; sums to 1)")
    ax.set_title("Parameter importances (Optuna)")
    return fig
