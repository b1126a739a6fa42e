"""Assemble a report from optional records: rows, figures, page; then write it atomically."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from matplotlib.figure import Figure
from pydantic import Field

from autotune.confirm import ConfirmRecord
from autotune.estimator import ModelFacts, facts_from_profile
from autotune.policy import SuggestRecord
from autotune.records import (
    DEFAULT_MARGIN,
    AutotuneError,
    Plan,
    ProfileRecord,
    Recommendation,
    Record,
    atomic_write_bytes,
    atomic_write_text,
    format_given_bytes,
)
from autotune.report import _changes, _collect, _figures, _html
from autotune.report._data import MemoryBar, ReportData, TrialPoint
from autotune.search import TuneRecord

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True, kw_only=True)
class ReportInputs:
    """What a report may draw from; every part is optional, at least one is needed."""

    profile: ProfileRecord | None = None
    suggestions: SuggestRecord | None = None
    confirm: ConfirmRecord | None = None
    tune: TuneRecord | None = None
    study: optuna.Study | None = None
    recommendation: Recommendation | None = None
    device_memory: int | None = None


@dataclass(frozen=True)
class Report:
    """A rendered report: the page and each figure as PNG bytes."""

    html: str
    figures: dict[str, tuple[str, bytes]]
    notes: list[str]


class ReportRecord(Record):
    """What ``autotune report --json`` prints: the files written and what was left out."""

    out: str
    figures: list[str] = Field(description="figure names, in page order")
    png_files: list[str] = Field(default_factory=list)
    sections: list[str] = Field(description="sections the page has")
    notes: list[str] = Field(default_factory=list, description="what was skipped and why")


def collect(inputs: ReportInputs) -> ReportData:
    """Turn the records into the report's rows.

    Raises:
        AutotuneError: no input at all.
    """
    given = (inputs.profile, inputs.suggestions, inputs.confirm, inputs.tune, inputs.study)
    if all(item is None for item in given) and inputs.recommendation is None:
        raise AutotuneError(
            "nothing to report: give a PROFILE, --suggestions, --confirm, --tune, --study "
            "or --recommendation"
        )
    budget = _budget(inputs)
    # Trials were judged against the budget tune was given; draw that one beside them.
    tune_budget = inputs.tune.device_memory if inputs.tune is not None else None
    trial_budget = (
        budget if inputs.device_memory is not None or tune_budget is None else tune_budget
    )
    data = ReportData(
        title=_title(inputs),
        budget_bytes=budget,
        trial_budget_bytes=trial_budget,
        trial_margin=_trial_margin(inputs) if trial_budget is not None else None,
    )
    facts = facts_from_profile(inputs.profile) if inputs.profile is not None else None
    if inputs.profile is not None:
        # With a tune record the baseline is tune's, not the profiled plan.
        label = "profiled" if inputs.tune is not None else "baseline"
        plan = facts.baseline.plan if facts is not None and facts.baseline else None
        data = _add_profile(data, inputs.profile, label, plan)
    _add_changes(data, inputs, facts)
    if inputs.tune is not None:
        data.memory_bars.extend(_tune_baseline_bars(inputs.tune, facts))
    data.trials.extend(_trials(inputs, data.notes))
    data = replace(data, importances=_importances(inputs, data.notes))
    rec = inputs.recommendation or (inputs.tune.recommendation if inputs.tune else None)
    data.summary.extend(_overview(data, rec))
    if inputs.tune is not None and inputs.tune.wall_time is not None:
        data.summary.append(("tune wall time", inputs.tune.wall_time.describe()))
    if rec is not None:
        data.recommendation.extend(_collect.recommendation_rows(rec))
        measured = rec.best.peak_memory_bytes if rec.best is not None else None
        if facts is not None or measured is not None:
            bar = _changes.plan_bar("recommended", rec.plan, facts, measured_peak=measured)
            data.memory_bars.append(bar)
        data.notes.extend(_peak_source_note(inputs, rec))
    return data


def _peak_source_note(inputs: ReportInputs, rec: Recommendation) -> list[str]:
    """Warn when the recommendation's measured peak and the profile's are different measures."""
    if inputs.profile is None or inputs.tune is None:
        return []
    ours = inputs.profile.memory.peak_source
    sources = {t.peak_source for t in inputs.tune.trials if t.plan == rec.plan and t.peak_source}
    theirs = sorted(sources - {ours})
    if not theirs:
        return []
    return [
        f"the trials measured peaks as {', '.join(theirs)} but the profile as {ours}: "
        "the two are different measures, compare peaks within one source only"
    ]


def _trial_margin(inputs: ReportInputs) -> float:
    """The margin tune kept free of its budget; the default where the record does not say."""
    margin = inputs.tune.margin if inputs.tune is not None else None
    return DEFAULT_MARGIN if margin is None else float(margin)


def _tune_baseline_bars(tune: TuneRecord, facts: ModelFacts | None) -> list[MemoryBar]:
    """Tune's baseline trial (the user's plan), measured if it ran, else as predicted."""
    trial = next((t for t in tune.trials if t.role == "baseline"), None)
    if trial is None:
        return []
    outcome = trial.outcome or trial.state
    return [
        _changes.plan_bar(
            "tune baseline",
            trial.plan,
            facts,
            predicted_peak=trial.predicted_peak_bytes,
            measured_peak=trial.peak_memory_bytes,
            note=f"; trial #{trial.number} {outcome}",
        )
    ]


def _add_profile(
    data: ReportData, profile: ProfileRecord, label: str, plan: Plan | None
) -> ReportData:
    rows, note = _collect.block_rows(profile)
    data.notes.extend([note] if note else [])
    data.summary.extend(_collect.profile_summary(profile))
    data.memory_bars.append(_collect.profile_bar(profile, label, plan))
    data.block_activations.extend(rows)
    return replace(data, step_split=_collect.step_split(profile))


def _add_changes(data: ReportData, inputs: ReportInputs, facts: ModelFacts | None) -> None:
    """Confirmed changes (kept ones get bars) when a confirm log is given, else the suggestions."""
    if inputs.confirm is not None:
        data.suggestions.extend(_changes.confirm_rows(inputs.confirm, inputs.suggestions))
        data.memory_bars.extend(_changes.kept_bars(inputs.confirm, facts))
        data.notes.extend(inputs.confirm.notes)
    elif inputs.suggestions is not None:
        data.suggestions.extend(_changes.suggestion_rows(inputs.suggestions))
        data.memory_bars.extend(_changes.suggestion_bars(inputs.suggestions, facts))
    if inputs.suggestions is not None:
        data.notes.extend(inputs.suggestions.notes)


def _overview(data: ReportData, rec: Recommendation | None) -> list[tuple[str, str]]:
    """Summary rows beyond the profile's: the budget drawn, the trials, the recommended plan."""
    budget = (
        format_given_bytes(data.budget_bytes)
        if data.budget_bytes
        else "none known (--device-memory sets one)"
    )
    rows = [("device budget drawn", budget)]
    if data.trials:
        counts = Counter(t.outcome for t in data.trials)
        rows.append(("trials", ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))))
    if rec is not None:
        speed = f", {rec.speedup:.2f}× the baseline (measured)" if rec.speedup is not None else ""
        rows.append(("recommended plan", f"{rec.plan.describe()} (from {rec.source}){speed}"))
    return rows


def _title(inputs: ReportInputs) -> str:
    if inputs.profile is not None:
        return f"autotune report: {inputs.profile.model.class_name}"
    if inputs.tune is not None:
        return f"autotune report: {Path(inputs.tune.model_file).name}"
    if inputs.study is not None:
        return f"autotune report: study {inputs.study.study_name}"
    return "autotune report"


def _budget(inputs: ReportInputs) -> int | None:
    """The device budget: given, else what suggest or tune used, else a profiled GPU's memory."""
    if inputs.device_memory is not None:
        return inputs.device_memory
    if inputs.suggestions is not None and inputs.suggestions.device_memory_bytes is not None:
        return inputs.suggestions.device_memory_bytes
    if inputs.tune is not None and inputs.tune.device_memory is not None:
        return inputs.tune.device_memory
    profile = inputs.profile
    # A CPU profile's "device memory" is the host's RAM, not a budget anyone set.
    if profile is not None and profile.config.device == "cuda":
        return profile.environment.device_memory_bytes
    return None


def _trials(inputs: ReportInputs, notes: list[str]) -> list[TrialPoint]:
    if inputs.tune is not None:
        return _collect.trial_points(inputs.tune.trials)
    if inputs.study is not None:
        from autotune.report._study import study_trials

        found, note = study_trials(inputs.study)
        notes += [note] if note else []
        return _collect.trial_points(found)
    return []


def _importances(inputs: ReportInputs, notes: list[str]) -> dict[str, float] | None:
    if inputs.study is None:
        if inputs.tune is not None:
            where = f"{inputs.tune.study!r} at {inputs.tune.storage}"
            notes.append(
                f"parameter importances skipped: the tune run's study {where} could not be opened"
            )
        return None
    from autotune.report._study import importances

    found, why = importances(inputs.study)
    notes += [why] if why else []
    return found


def render(data: ReportData) -> Report:
    """Draw the figures the data has and lay out the page."""
    ratios = any(
        r.predicted_ratio is not None or r.measured_ratio is not None for r in data.suggestions
    )
    wanted: list[tuple[str, str, bool, Callable[[], Figure]]] = [
        ("memory", "Memory per device at each plan's peak, by category, with the device budget", bool(data.memory_bars),
         lambda: _figures.memory_figure(data.memory_bars, data.budget_bytes)),
        ("blocks", "Activation bytes saved for backward, per module (measured)", bool(data.block_activations),
         lambda: _figures.block_figure(data.block_activations)),
        ("step", "Median step time by phase (measured)", data.step_split is not None,
         lambda: _figures.step_figure(data.step_split)),  # type: ignore[arg-type]
        ("changes", "Step time after / before each change: predicted, and measured once confirmed", ratios,
         lambda: _figures.changes_figure(data.suggestions)),
        ("trials", "Trials: peak memory against throughput, Pareto front drawn", bool(data.trials),
         lambda: _figures.trials_figure(data.trials, data.trial_budget_bytes, data.trial_margin)),
        ("importances", "Optuna parameter importances", bool(data.importances),
         lambda: _figures.importance_figure(data.importances or {})),
    ]  # fmt: skip
    figures = {
        name: (caption, _figures.to_png(draw())) for name, caption, show, draw in wanted if show
    }
    return Report(_html.render_page(data, figures), figures, list(data.notes))


def build_report(inputs: ReportInputs) -> Report:
    """Collect the rows from the records and render the page with its figures."""
    return render(collect(inputs))


def write_report(
    report: Report, out: str | Path, png_dir: str | Path | None = None
) -> ReportRecord:
    """Write each figure as a PNG file when asked, then the page; every file atomically.

    Raises:
        AutotuneError: the output folder does not exist or the PNG folder cannot be made.
    """
    target = Path(out)
    if not target.parent.is_dir():
        raise AutotuneError(f"--out: directory {target.parent} does not exist")
    pngs: list[str] = []
    if png_dir is not None:
        folder = Path(png_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AutotuneError(f"--png-dir: cannot create {folder}: {exc.strerror}") from None
        for name, (_caption, png) in report.figures.items():
            pngs.append(str(atomic_write_bytes(folder / f"{name}.png", png)))
    atomic_write_text(target, report.html)
    sections = [name for name in _html.SECTIONS if f'id="sec-{name}"' in report.html]
    return ReportRecord(
        out=str(target),
        figures=list(report.figures),
        png_files=pngs,
        sections=sections,
        notes=report.notes,
    )
