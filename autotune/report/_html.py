"""The report page: one self-contained HTML file with inline CSS and inline PNG figures, no script."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence

from autotune.records import format_bytes, format_given_bytes
from autotune.report._data import CATEGORIES, ReportData, TrialPoint, pareto_front

SECTIONS = (
    "summary",
    "memory",
    "blocks",
    "step",
    "suggestions",
    "trials",
    "importances",
    "recommendation",
)
"""The page's sections in order; each heading has the id ``sec-<name>``."""

_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.8em 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
.note { color: #6a4d00; background: #fff8e1; padding: 0.3em 0.6em; border-left: 3px solid #e0b000; }
.muted { color: #666; font-size: 0.85em; }
"""


def render_page(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> str:
    """The whole page as one HTML string.

    Args:
        data: what the report shows.
        figures: figure name -> (caption, PNG bytes); a missing name leaves its figure out.
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(data.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(data.title)}</h1>",
        '<p class="muted">Every figure says where it comes from: <b>measured</b> (a real run), '
        "<b>traced</b> (counted on the model with no allocation) or <b>formula</b> (the cost model).</p>",
    ]
    if data.summary:
        parts += [_h2("Summary", "summary"), _table(("", ""), data.summary, header=False)]
    parts += [f'<p class="note">{_e(note)}</p>' for note in data.notes]
    parts += _memory_section(data, figures)
    parts += _block_section(data, figures)
    parts += _step_section(data, figures)
    parts += _suggestion_section(data, figures)
    parts += _trial_section(data, figures)
    parts += _figure_section("Parameter importances", "importances", figures)
    if data.recommendation:
        parts += [
            _h2("Recommendation", "recommendation"),
            _table(("", ""), data.recommendation, header=False),
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _h2(title: str, key: str) -> str:
    return f'<h2 id="sec-{key}">{_e(title)}</h2>'


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _img(name: str, figures: dict[str, tuple[str, bytes]]) -> str:
    caption, png = figures[name]
    encoded = base64.b64encode(png).decode("ascii")
    return (
        f'<figure id="fig-{name}"><img alt="{_e(caption)}" src="data:image/png;base64,{encoded}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _table(head: Sequence[str], rows: Iterable[Sequence[object]], header: bool = True) -> str:
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            tag = "th" if not header and i == 0 else "td"
            # Right-align numeric columns of data tables; key/value tables stay left-aligned.
            css = ' class="num"' if header and _looks_numeric(cell) else ""
            cells.append(f"<{tag}{css}>{_e(cell)}</{tag}>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _looks_numeric(cell: object) -> bool:
    text = str(cell)
    return bool(text) and (text[0].isdigit() or text[0] in "–×")


def _figure_section(title: str, name: str, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    return [_h2(title, name), _img(name, figures)] if name in figures else []


def _memory_section(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    if not data.memory_bars:
        return []
    head = (
        "bar",
        "plan",
        "ranks",
        "source",
        *(c.replace("_", " ") for c in CATEGORIES),
        "sum (the peak drawn)",
        "predicted peak",
        "measured peak",
    )
    rows = []
    for bar in data.memory_bars:
        cells = [format_bytes(bar.parts[c]) if c in bar.parts else "–" for c in CATEGORIES]
        peaks = (format_bytes(bar.predicted_peak), format_bytes(bar.measured_peak))
        ranks = "–" if bar.ranks is None else bar.ranks
        rows.append(
            (
                bar.label,
                bar.plan or "–",
                ranks,
                bar.source,
                *cells,
                format_bytes(bar.height),
                *peaks,
            )
        )
    budget = (
        f"Device budget: {format_given_bytes(data.budget_bytes)}."
        if data.budget_bytes
        else "No device budget known."
    )
    out = [_h2("Memory breakdown", "memory")]
    if "memory" in figures:
        out.append(_img("memory", figures))
    explain = (
        "Each bar is what was live at the moment its plan peaks, by category, so it ends at "
        "that peak: the measured peak when the plan ran, else the predicted one. A measured "
        "profile splits its own peak; other bars split theirs with the estimator's categories "
        "at the moment the plan peaks (other = buffers, autocast weight copies, temporaries "
        "and the rest of the peak). The budget is judged on the peak."
    )
    return [*out, f"<p>{_e(budget)} {_e(explain)}</p>", _table(head, rows)]


def _block_section(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    if not data.block_activations:
        return []
    total = sum(value for _, value in data.block_activations)
    rows = [
        (name, format_bytes(value), f"{value / total:.1%}" if total else "–")
        for name, value in data.block_activations
    ]
    out = _figure_section("Activations per block", "blocks", figures) or [
        _h2("Activations per block", "blocks")
    ]
    return [*out, _table(("module", "saved for backward (measured)", "share"), rows)]


def _step_section(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    split = data.step_split
    if split is None:
        return []
    phases = {**split.phases, "other": split.other}
    rows = [
        (name, f"{sec * 1e3:.2f} ms", f"{sec / split.step:.1%}" if split.step else "–")
        for name, sec in phases.items()
    ]
    rows.append(("step", f"{split.step * 1e3:.2f} ms", "100.0%"))
    out = _figure_section("Step-time split", "step", figures) or [_h2("Step-time split", "step")]
    return [*out, _table(("phase", "median (measured)", "share"), rows)]


def _kv(values: dict[str, object] | None) -> str:
    if not values:
        return "–"
    return "; ".join(f"{key}: {value}" for key, value in values.items())


def _suggestion_section(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    if not data.suggestions:
        return []
    head = ("rule", "change", "reason", "evidence", "predicted", "measured", "kept")
    rows = []
    for s in data.suggestions:
        kept = "–" if s.kept is None else ("yes" if s.kept else "no")
        rows.append(
            (s.rule, s.change, s.reason, _kv(s.evidence), _kv(s.predicted), _kv(s.measured), kept)
        )
    out = [_h2("Suggestions", "suggestions")]
    if "changes" in figures:
        out.append(_img("changes", figures))
    return [*out, _table(head, rows)]


def _trial_section(data: ReportData, figures: dict[str, tuple[str, bytes]]) -> list[str]:
    if not data.trials:
        return []
    counts = {
        o: sum(t.outcome == o for t in data.trials)
        for o in ("ok", "oom", "timeout", "crash", "pruned")
    }
    line = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    front = {t.number for t in pareto_front(data.trials)}
    rows = [_trial_row(t, t.number in front) for t in data.trials]
    head = ("trial", "plan", "outcome", "samples/s", "peak memory", "Pareto", "note")
    out = _figure_section("Trials", "trials", figures) or [_h2("Trials", "trials")]
    budget = (
        format_given_bytes(data.trial_budget_bytes) if data.trial_budget_bytes else "none given"
    )
    usable = data.trial_usable_bytes
    kept = (
        f"; usable part {format_bytes(usable)} (budget x (1 - {data.trial_margin:g})): plans "
        "predicted above it were pruned"
        if usable is not None
        else ""
    )
    text = (
        f"{len(data.trials)} trials: {line}. Budget the trials were judged against: {budget}{kept}."
    )
    return [*out, f"<p>{_e(text)}</p>", _table(head, rows)]


def _trial_row(t: TrialPoint, on_front: bool) -> tuple[object, ...]:
    speed = "–" if t.samples_per_s is None else f"{t.samples_per_s:.2f}"
    return (
        t.number,
        t.plan,
        t.outcome,
        speed,
        format_bytes(t.peak_memory_bytes),
        "yes" if on_front else "",
        t.note,
    )
