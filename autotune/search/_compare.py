"""The final comparison: best, baseline and runner-up re-run interleaved; the recommendation."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotune.records import MeasuredPlan, Plan, Recommendation, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._records import Comparison, TrialRecord
from autotune.search._runner import TrialRunner

BASELINE = "baseline"
BEST = "search best"
BOTH = "search best = baseline"
Round = list[tuple[float, float | None, int | None] | None]


def entries(
    ranked: list[TrialRecord], baseline: TrialRecord | None
) -> list[tuple[str, TrialRecord]]:
    """What the final comparison re-runs, labelled: the search's best, the baseline, the runner-up."""
    if baseline is not None and baseline.plan == ranked[0].plan:
        chosen = [(BOTH, ranked[0])]
    else:
        chosen = [(BEST, ranked[0])] + ([(BASELINE, baseline)] if baseline is not None else [])
    runner_up = next((r for r in ranked[1:] if baseline is None or r.plan != baseline.plan), None)
    if runner_up is not None:
        chosen.append(("runner-up", runner_up))
    return chosen


def _rounds(
    runner: TrialRunner, settings: TrialSettings, plans: list[Plan], repeats: int
) -> list[Round]:
    """``repeats`` rounds; each runs every plan once, the order rotating between rounds."""
    rounds = []
    for index in range(repeats):
        row: Round = [None] * len(plans)
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


def baseline_index(labels: list[str]) -> int | None:
    """Where the baseline is among the compared entries (``None``: it did not run)."""
    return next((i for i, label in enumerate(labels) if label in (BASELINE, BOTH)), None)


def compare(runner: TrialRunner, settings: TrialSettings, ranked: list[TrialRecord],
            baseline: TrialRecord | None, repeats: int) -> Comparison:  # fmt: skip
    """Re-run the search's best, the baseline and the runner-up ``repeats`` times, interleaved.

    The winner is the highest median, whichever it is: the search-time numbers
    are single runs on a noisy machine. The speedup interval is the range of
    per-round ratios winner/baseline: both ran in the same round, so slow
    phases of the machine hit both.
    """
    chosen = entries(ranked, baseline)
    labels = [label for label, _ in chosen]
    base = baseline_index(labels)
    if repeats < 1:
        measured = [_from_search(record) for _, record in chosen]
        ratio = (
            measured[0].samples_per_s / measured[base].samples_per_s if base is not None else None
        )
        return Comparison(repeats=0, measured=measured, labels=labels, speedup=ratio)
    rounds = _rounds(runner, settings, [record.plan for _, record in chosen], repeats)
    measured = []
    for column, (_, record) in enumerate(chosen):
        values = [row[column] for row in rounds if row[column] is not None]
        measured.append(_measured(record.plan, values) if values else _from_search(record))  # type: ignore[arg-type]
    ran = [i for i in range(len(chosen)) if any(row[i] for row in rounds)] or [0]
    winner = max(ran, key=lambda i: measured[i].samples_per_s)
    speedup, interval = _speedup(rounds, winner, base)
    return Comparison(repeats=repeats, measured=measured, labels=labels, winner=winner,
                      speedup=speedup, speedup_interval=interval)  # fmt: skip


def _speedup(
    rounds: list[Round], winner: int, base: int | None
) -> tuple[float | None, tuple[float, float] | None]:
    if base is None:
        return None, None
    ratios = [row[winner][0] / row[base][0] for row in rounds if row[winner] and row[base]]  # type: ignore[index]
    if not ratios:
        return None, None
    return statistics.median(ratios), (min(ratios), max(ratios))


def recommendation(ranked: list[TrialRecord], comparison: Comparison | None, model_file: str,
                   code_changes: Callable[[Plan], list[Any]] | None,
                   notes: list[str]) -> Recommendation | None:  # fmt: skip
    """The tune recommendation: the comparison's winner next to the baseline."""
    if not ranked:
        notes.append("no plan ran to completion: nothing to recommend")
        return None
    if comparison is None:  # left to another worker; a note says which
        return None
    labels = comparison.labels
    best = comparison.measured[comparison.winner]
    base = baseline_index(labels)
    if comparison.repeats:
        notes.append(f"search best, baseline and runner-up re-run {comparison.repeats}x interleaved: "
                     "medians; intervals are min-max over the repeats")  # fmt: skip
    else:
        notes.append("repeats=0: nothing re-run; the search's single runs are compared, so the "
                     "ranking and the speedup carry the machine's run-to-run noise and no interval")  # fmt: skip
    if labels[comparison.winner] not in (BEST, BOTH):
        notes.append(f"the {labels[comparison.winner]} measured fastest in the re-runs, "
                     f"not the search's best ({ranked[0].plan.describe()})")  # fmt: skip
    low = comparison.speedup_interval[0] if comparison.speedup_interval else None
    if low is not None and low <= 1.0 and labels[comparison.winner] not in (BASELINE, BOTH):
        notes.append("the speedup interval reaches 1.0: not a clear win over the baseline")
    return Recommendation(
        source="tune", plan=best.plan, model_file=model_file, best=best,
        baseline=comparison.measured[base] if base is not None else None,
        speedup=comparison.speedup, speedup_interval=comparison.speedup_interval,
        code_changes=code_changes(best.plan) if code_changes else [], notes=list(notes),
    )  # fmt: skip
