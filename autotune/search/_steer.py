"""How the cost model and the measured trials steer the search (pure): the predicted front the
study starts from, the rule that skips a plan predicted slower than the best measured one beyond
the error bar, and the step time above which a trial stops measuring.

Every plan of a study keeps the global batch, so throughput is inversely proportional to
step time and the estimate's step-time ratios rank plans directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from autotune.records import FRONT_SIZE, Plan
from autotune.search._records import RUN_SPREAD, TrialRecord
from autotune.search._space import Predict, Prediction, SearchSpace

DEFAULT_ERROR = 0.15
"""The step-time model's error bar before any trial has measured it: the worst predicted
ratio of bench/estimate_accuracy.py was 15 % off."""


@dataclass(frozen=True)
class Ranked:
    """A plan of the space with its prediction."""

    plan: Plan
    prediction: Prediction


def rank(space: SearchSpace, predict: Predict) -> list[Ranked]:
    """The plans predicted to fit that have a predicted step time, fastest first."""
    ranked = []
    for plan in space.all_plans():
        prediction = predict(plan)
        if prediction.fits and prediction.step_time_ratio is not None:
            ranked.append(Ranked(plan, prediction))
    return sorted(ranked, key=lambda r: (r.prediction.step_time_ratio, r.plan.checkpoint_blocks))


def predicted_front(space: SearchSpace, predict: Predict, size: int = FRONT_SIZE) -> list[Plan]:
    """The fastest predicted plan of each engine, ZeRO stage and precision, fastest first.

    The step-time model does not see communication without a bandwidth, nor other
    precisions than the profiled one, and knows each engine's own costs from stand-in stacks
    only, so one plan per engine, stage and precision is measured rather than trusting the
    model across them (on the 124M model on an Intel Xeon, keyed by stage alone, DeepSpeed's
    ZeRO-2 at bf16 mb=4 took stage 2's place, predicted 2.3 % ahead of FSDP2's, and ran 1.39
    samples/s against FSDP2's 1.51, the grid's best).
    """
    best: dict[tuple[str, int, str], Plan] = {}
    for ranked in rank(space, predict):
        plan = ranked.plan
        best.setdefault((plan.engine, plan.zero_stage, plan.precision), plan)
    return list(best.values())[:size]


def error_bar(measured: Iterable[TrialRecord], default: float = DEFAULT_ERROR) -> float:
    """How much too slow the model has predicted a plan relative to the best measured one.

    Only that direction can make a skip wrong (a plan predicted slow that is fast), so
    the bar is the default or the largest such error seen so far, whichever is larger.
    """
    done = [r for r in measured if _timed(r)]
    if not done:
        return default
    best = min(done, key=lambda r: r.step_time or 0.0)
    worst = default
    for record in done:
        predicted = (record.predicted_step_ratio or 0.0) / (best.predicted_step_ratio or 1.0)
        actual = (record.step_time or 0.0) / (best.step_time or 1.0)
        if actual > 0:
            worst = max(worst, predicted / actual - 1.0)
    return worst


def slower_than_best(prediction: Prediction | None, records: list[TrialRecord]) -> str | None:
    """Why a plan is skipped: predicted slower than the best measured plan beyond the error
    bar plus that plan's own measurement noise (``None``: run it)."""
    if prediction is None or prediction.step_time_ratio is None:
        return None
    done = [r for r in records if _timed(r)]
    if not done:
        return None
    best = min(done, key=lambda r: r.step_time or 0.0)
    relative = prediction.step_time_ratio / (best.predicted_step_ratio or 1.0)
    bar, noise = error_bar(done), _noise(best)
    if relative <= 1.0 + bar + noise:
        return None
    return (f"predicted x{relative:.2f} the step time of the best measured plan (trial "
            f"{best.number}), beyond the estimate's error bar of {bar:.0%} and that trial's "
            f"measurement noise of {noise:.0%}")  # fmt: skip


def stop_slower_than(records: list[TrialRecord]) -> tuple[float, int] | None:
    """The step time above which a trial stops measuring, and the trial it comes from: the best
    measured plan's interval's top, :data:`RUN_SPREAD` (one run's spread from its plan's median)
    above it: a plan whose steps all come above it is slower than that plan beyond the spread
    between runs, so more of its steps cannot make it the pick. ``None`` before any plan was
    measured. The baseline is always measured to its interval (the speedup's denominator)."""
    measured = [r for r in records if r.outcome == "ok" and r.samples_per_s and r.step_interval]
    if not measured:
        return None
    best = max(measured, key=lambda r: r.samples_per_s or 0.0)
    assert best.step_interval is not None
    return best.step_interval[1] * (1 + RUN_SPREAD), best.number


def _noise(record: TrialRecord) -> float:
    """Half the width of a trial's median step-time interval, relative to the median, and at
    least the spread between runs of one plan (:data:`RUN_SPREAD`)."""
    if record.step_interval is None or not record.step_time:
        return RUN_SPREAD
    low, high = record.step_interval
    return max((high - low) / 2 / record.step_time, RUN_SPREAD)  # high < low: the floor


def _timed(record: TrialRecord) -> bool:
    return (
        record.outcome == "ok"
        and record.step_time is not None
        and record.step_time > 0
        and record.predicted_step_ratio is not None
        and record.predicted_step_ratio > 0
    )
