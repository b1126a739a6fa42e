"""Suggested and kept changes, and the recommendation, as table rows and predicted memory bars."""

from __future__ import annotations

from autotune.confirm import ConfirmRecord, ConfirmStep, Measured
from autotune.estimator import ModelFacts, PlanEstimate, estimate_plan, moments
from autotune.policy import Predicted, Suggestion, SuggestRecord
from autotune.records import Plan, format_bytes
from autotune.report._data import MemoryBar, SuggestionRow


def plan_bar(
    label: str,
    plan: Plan,
    facts: ModelFacts | None,
    *,
    predicted_peak: int | None = None,
    measured_peak: int | None = None,
    note: str = "",
) -> MemoryBar:
    """A bar for ``plan`` that ends at its peak: the measured one when it ran, else the predicted.

    With model facts the peak is split into the estimator's categories at the moment the
    plan peaks (``estimator.moments``), ``other`` being the rest of the peak (buffers,
    autocast copies, temporaries); the predicted peak defaults to the estimator's. Without
    facts, or when the categories exceed a measured peak, only a total is drawn.
    """
    est = estimate_plan(facts, plan) if facts is not None else None
    if predicted_peak is None and est is not None:
        predicted_peak = est.memory.peak
    height = measured_peak if measured_peak is not None else predicted_peak
    kind = "measured" if measured_peak is not None else "predicted"
    split = (
        _split_at_peak(facts, est, height)
        if facts is not None and est is not None and height is not None
        else None
    )
    source = kind if split is None else f"{kind} peak, split at its {split[0]} ({est.source})"  # type: ignore[union-attr]
    return MemoryBar(
        label,
        split[1] if split else {},
        source + note,
        total=None if split else height,
        predicted_peak=predicted_peak,
        measured_peak=measured_peak,
        plan=plan.describe(),
        ranks=plan.world_size,
    )


def _split_at_peak(
    facts: ModelFacts, est: PlanEstimate, peak: int
) -> tuple[str, dict[str, int]] | None:
    """The moment the plan peaks and its categories there, ``other`` filling up to ``peak``."""
    by_moment, _, _ = moments(facts, est.plan)
    named = est.memory.peak_composition.split(" ", 1)[0]  # "backward (measured moment ...)"
    moment = (
        named
        if named in by_moment
        else max(by_moment, key=lambda name: sum(by_moment[name].values()))
    )
    live = by_moment[moment]
    parts = {
        c: round(live[c]) for c in ("parameters", "gradients", "optimizer_states", "activations")
    }
    rest = peak - sum(parts.values())
    if rest < 0:
        return None
    return moment, {**parts, "other": rest}


def suggestion_rows(record: SuggestRecord) -> list[SuggestionRow]:
    """One row per suggestion, in the order the policy applies them."""
    return [_row(s) for s in record.suggestions]


def _row(s: Suggestion) -> SuggestionRow:
    evidence: dict[str, object] = {
        name: f"{_value(name, e.value)} ({e.source})" for name, e in s.evidence.items()
    }
    return SuggestionRow(
        rule=s.rule,
        change=_knobs(s.change),
        reason=s.reason,
        evidence=evidence,
        predicted=predicted_effect(s.predicted),
        predicted_ratio=s.predicted.step_time_ratio,
    )


def _knobs(change: dict[str, object]) -> str:
    return ", ".join(f"{knob}={value}" for knob, value in change.items())


def _value(name: str, value: object) -> str:
    """A fact's value for people: sizes in binary units, yes/no, three significant digits."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float) and "bytes" in name:
        return format_bytes(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return "–" if value is None else str(value)


def predicted_effect(p: Predicted) -> dict[str, object]:
    """The predicted change in peak memory and step time, with units and sources."""
    out: dict[str, object] = {}
    if p.peak_bytes_after is not None:
        before = format_bytes(p.peak_bytes_before)
        out["peak"] = f"{before} → {format_bytes(p.peak_bytes_after)} ({p.memory_source})"
    if p.fits_after is not None:
        out["fits"] = "yes" if p.fits_after else "no"
    if p.step_time_ratio is not None:
        out["step time"] = f"×{p.step_time_ratio:.2f} ({p.time_source or 'formula'})"
    return out


def suggestion_bars(record: SuggestRecord, facts: ModelFacts | None) -> list[MemoryBar]:
    """A predicted bar after each suggestion, each stacked on the ones before."""
    return [
        plan_bar(f"+ {s.rule}", s.plan, facts, predicted_peak=s.predicted.peak_bytes_after)
        for s in record.suggestions
    ]


def confirm_rows(record: ConfirmRecord, suggestions: SuggestRecord | None) -> list[SuggestionRow]:
    """One row per change the confirm session tried, with the evidence suggest gave for its rule."""
    evidence = {s.rule: _row(s).evidence for s in suggestions.suggestions} if suggestions else {}
    reasons = {s.rule: s.reason for s in suggestions.suggestions} if suggestions else {}
    return [
        SuggestionRow(
            rule=step.rule,
            change=_knobs(step.change),
            reason=step.why if step.rule not in reasons else f"{reasons[step.rule]} — {step.why}",
            evidence=evidence.get(step.rule, {}),
            predicted=predicted_effect(step.predicted),
            measured=measured_effect(step.measured),
            kept=None
            if step.status in ("not_confirmable", "not_applicable")
            else step.status == "kept",
            predicted_ratio=step.predicted.step_time_ratio,
            measured_ratio=step.measured.step_time_ratio if step.measured else None,
            measured_interval=step.measured.ratio_interval if step.measured else None,
        )
        for step in record.steps
    ]


def measured_effect(m: Measured | None) -> dict[str, object] | None:
    """The measured change in step time (with its interval), loss and peak memory."""
    if m is None:
        return None
    low, high = m.ratio_interval
    out: dict[str, object] = {
        "step time": f"×{m.step_time_ratio:.2f} ({low:.2f}–{high:.2f}, {m.repeats} repeats)",
        "step": f"{m.before_step_s * 1e3:.1f} → {m.after_step_s * 1e3:.1f} ms",
    }
    if m.loss_delta is not None:
        out["loss"] = f"{m.loss_delta:+.2%}"
    if m.peak_bytes_after is not None:
        out["peak"] = f"{format_bytes(m.peak_bytes_before)} → {format_bytes(m.peak_bytes_after)}"
    return out


def kept_bars(record: ConfirmRecord, facts: ModelFacts | None) -> list[MemoryBar]:
    """A bar after each change the confirm session kept, with its measured peak."""
    return [_kept_bar(step, facts) for step in record.steps if step.status == "kept"]


def _kept_bar(step: ConfirmStep, facts: ModelFacts | None) -> MemoryBar:
    measured = step.measured.peak_bytes_after if step.measured else None
    return plan_bar(
        f"+ {step.rule} (kept)",
        step.plan,
        facts,
        predicted_peak=step.predicted.peak_bytes_after,
        measured_peak=measured,
    )
