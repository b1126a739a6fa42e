"""The final comparison: best, baseline and runner-up re-run interleaved; the recommendation."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotune.plan import Plan
from autotune.recommend import MeasuredPlan, Recommendation
from autotune.search._outcome import classify_outcome
from autotune.search._records import Comparison, TrialRecord, TrialSettings
from autotune.search._runner import TrialRunner


def _entries(
    ranked: list[TrialRecord], baseline: TrialRecord | None
) -> list[tuple[str, TrialRecord]]:
    entries = [("best", ranked[0])]
    if baseline is not None and baseline.plan != ranked[0].plan:
        entries.append(("baseline", baseline))
    runner_up = next((r for r in ranked[1:] if baseline is None or r.plan != baseline.plan), None)
    if runner_up is not None:
        entries.append(("runner-up", runner_up))
    return entries


def _rounds(runner: TrialRunner, settings: TrialSettings, plans: list[Plan], repeats: int
            ) -> list[list[tuple[float, float | None, int | None] | None]]:  # fmt: skip
    """``repeats`` rounds; each runs every plan once, the order rotating between rounds."""
    rounds = []
    for index in range(repeats):
        row: list[tuple[float, float | None, int | None] | None] = [None] * len(plans)
        shift = index % len(plans)
        for position in list(range(shift, len(plans))) + list(range(shift)):
            report = runner.run(plans[position], settings)
            result = report.result
            outcome = classify_outcome(
                report.returncode, report.timed_out, result, report.stderr_tail
            )
            if outcome == "ok" and result is not None and result.samples_per_s is not None:
                row[position] = (result.samples_per_s, result.tokens_per_s, result.peak)
        rounds.append(row)
    return rounds


def _measured(plan: Plan, values: list[tuple[float, float | None, int | None]]) -> MeasuredPlan:
    samples = [v[0] for v in values]
    tokens = [v[1] for v in values if v[1] is not None]
    peaks = [v[2] for v in values if v[2] is not None]
    return MeasuredPlan(
        plan=plan,
        samples_per_s=statistics.median(samples),
        samples_per_s_interval=(min(samples), max(samples)),
        tokens_per_s=statistics.median(tokens) if tokens else None,
        peak_memory_bytes=max(peaks) if peaks else None,
        repeats=len(values),
    )


def _from_search(record: TrialRecord) -> MeasuredPlan:
    return MeasuredPlan(plan=record.plan, samples_per_s=record.samples_per_s or 0.0,
                        tokens_per_s=record.tokens_per_s, peak_memory_bytes=record.peak_memory_bytes)  # fmt: skip


def compare(runner: TrialRunner, settings: TrialSettings, ranked: list[TrialRecord],
            baseline: TrialRecord | None, repeats: int) -> Comparison:  # fmt: skip
    """Re-run best, baseline and runner-up ``repeats`` times, interleaved.

    The speedup interval is the range of per-round ratios best/baseline: both
    ran in the same round, so slow phases of the machine hit both.
    """
    entries = _entries(ranked, baseline)
    labels = [label for label, _ in entries]
    if repeats < 1:
        measured = [_from_search(record) for _, record in entries]
        return Comparison(repeats=0, measured=measured, labels=labels)
    rounds = _rounds(runner, settings, [record.plan for _, record in entries], repeats)
    measured = []
    for column, (_, record) in enumerate(entries):
        values = [row[column] for row in rounds if row[column] is not None]
        measured.append(_measured(record.plan, values) if values else _from_search(record))  # type: ignore[arg-type]
    order = sorted(
        range(len(entries)),
        key=lambda i: -measured[i].samples_per_s if labels[i] != "baseline" else 0,
    )
    winner = order[0]
    labels = ["best" if i == winner else ("baseline" if labels[i] == "baseline" else "runner-up")
              for i in range(len(entries))]  # fmt: skip
    speedup, interval = _speedup(rounds, labels) if baseline is not None else (None, None)
    return Comparison(repeats=repeats, measured=measured, labels=labels, speedup=speedup,
                      speedup_interval=interval)  # fmt: skip


def _speedup(
    rounds: list[list[Any]], labels: list[str]
) -> tuple[float | None, tuple[float, float] | None]:
    if "baseline" not in labels:
        return (1.0, (1.0, 1.0)) if rounds else (None, None)  # the baseline is the best plan
    best, base = labels.index("best"), labels.index("baseline")
    ratios = [row[best][0] / row[base][0] for row in rounds if row[best] and row[base]]
    if not ratios:
        return None, None
    return statistics.median(ratios), (min(ratios), max(ratios))


def recommendation(ranked: list[TrialRecord], baseline: TrialRecord | None,
                   comparison: Comparison | None, model_file: str,
                   code_changes: Callable[[Plan], list[Any]] | None,
                   notes: list[str]) -> Recommendation | None:  # fmt: skip
    """The tune recommendation: the comparison's winner next to the baseline."""
    if not ranked or comparison is None:
        notes.append("no plan ran to completion: nothing to recommend")
        return None
    labels = comparison.labels
    best = comparison.measured[labels.index("best")]
    base: MeasuredPlan | None = best if baseline is not None else None
    if "baseline" in labels:
        base = comparison.measured[labels.index("baseline")]
    if comparison.repeats:
        notes.append(f"best, baseline and runner-up re-run {comparison.repeats}x interleaved: "
                     "medians, intervals are min-max over the repeats")  # fmt: skip
    low = comparison.speedup_interval[0] if comparison.speedup_interval else None
    if low is not None and low <= 1.0 and "baseline" in labels:
        notes.append("the speedup interval reaches 1.0 or below: not a clear win over the baseline")
    return Recommendation(
        source="tune", plan=best.plan, model_file=model_file, best=best, baseline=base,
        speedup=comparison.speedup, speedup_interval=comparison.speedup_interval,
        code_changes=code_changes(best.plan) if code_changes else [], notes=list(notes),
    )  # fmt: skip
