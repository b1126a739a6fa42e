"""Which knobs a plan pays for (pure): checkpointing or a higher ZeRO stage that the plan does
not need to fit is not worth its cost, so the search tries the plan without it instead.

Checkpointing only ever costs time (the recompute), so it pays only by lowering the peak
below the budget. A higher ZeRO stage can pay in time too (each rank steps a shard of the
optimizer), so it is dropped only where the estimate predicts the lower stage no slower and
no measurement has shown the higher stages ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.records import Plan, format_bytes
from autotune.search._records import TrialRecord
from autotune.search._space import Prediction, SearchSpace, oom_lesson


@dataclass(frozen=True)
class Unpaid:
    """A knob a plan turns that buys nothing: the leaner twin to try instead, and why."""

    twin: Plan
    reason: str


def unpaid_knob(plan: Plan, space: SearchSpace, predict: Callable[[Plan], Prediction],
                records: list[TrialRecord], *, stages: bool = True) -> Unpaid | None:  # fmt: skip
    """The leaner twin of ``plan`` (same micro-batch, so the same global batch) that is
    predicted to fit and has not run out of memory; ``None``: every knob of it pays.

    Args:
        plan: the plan the search is about to run.
        space: the study's space (names the lower-stage twin).
        predict: the estimate.
        records: the study's trials (out-of-memory lessons, and whether a stage paid).
        stages: whether to drop unpaid ZeRO stages too (not for the predicted front, which
            measures one plan per stage on purpose).
    """
    ooms = [r.plan for r in records if r.outcome == "oom"]
    unpaid = _unpaid_checkpointing(plan, predict, ooms)
    if unpaid is None and stages and not _stage_measured_ahead(plan.zero_stage, records):
        unpaid = _unpaid_stage(plan, space, predict, ooms)
    return unpaid


def _fits(plan: Plan, predict: Callable[[Plan], Prediction], ooms: list[Plan]) -> bool:
    return predict(plan).fits and plan not in ooms and oom_lesson(plan, ooms) is None


def _unpaid_checkpointing(
    plan: Plan, predict: Callable[[Plan], Prediction], ooms: list[Plan]
) -> Unpaid | None:
    """The plan with the fewest checkpointed blocks that is predicted to fit (fewer than its own)."""
    for blocks in range(plan.checkpoint_blocks):
        twin = plan.with_changes(checkpoint_blocks=blocks)
        if not _fits(twin, predict, ooms):
            continue
        mine, theirs = predict(plan), predict(twin)
        at = f" (set by {mine.peak_moment})" if mine.peak_moment else ""
        if mine.peak_bytes is not None and mine.peak_bytes >= (theirs.peak_bytes or 0):
            how = f"does not lower the predicted peak{at}"
        else:
            how = "lowers a peak that fits without it"
        shown = format_bytes(theirs.peak_bytes) if theirs.peak_bytes is not None else "?"
        return Unpaid(twin, f"checkpointing {plan.checkpoint_blocks} blocks {how}: "
                            f"{twin.describe()} is predicted to fit at {shown}")  # fmt: skip
    return None


def _unpaid_stage(plan: Plan, space: SearchSpace, predict: Callable[[Plan], Prediction],
                  ooms: list[Plan]) -> Unpaid | None:  # fmt: skip
    """The lowest ZeRO stage below the plan's predicted to fit and to be no slower."""
    mine = predict(plan)
    if mine.step_time_ratio is None or plan.engine != "deepspeed":
        return None
    for stage in range(plan.zero_stage):
        twin = space.plan({**space.params(plan), "zero_stage": stage})
        theirs = predict(twin)
        if theirs.step_time_ratio is None or theirs.step_time_ratio > mine.step_time_ratio:
            continue
        if _fits(twin, predict, ooms):
            return Unpaid(twin, f"ZeRO stage {plan.zero_stage} buys nothing here: "
                                f"{twin.describe()} is predicted to fit and to be no slower")  # fmt: skip
    return None


def _stage_measured_ahead(stage: int, records: list[TrialRecord]) -> bool:
    """Whether the fastest measured plan so far shards at least ``stage``: then the
    measurements, not the estimate, say the higher stages are worth running."""
    done = [r for r in records if r.outcome == "ok" and r.samples_per_s is not None]
    if not done or stage == 0:
        return False
    fastest = max(done, key=lambda r: r.samples_per_s or 0.0)
    return fastest.plan.zero_stage >= stage


def leaner_plan(plan: Plan, space: SearchSpace, predict: Callable[[Plan], Prediction] | None,
                records: list[TrialRecord], *, stages: bool = True) -> tuple[Plan, str | None]:  # fmt: skip
    """``plan`` with its unpaid knobs dropped, one after the other, and the first reason."""
    if predict is None:
        return plan, None
    first: str | None = None
    for _ in range(2):  # checkpointing, then the stage
        unpaid = unpaid_knob(plan, space, predict, records, stages=stages)
        if unpaid is None:
            break
        first = first or unpaid.reason
        plan = unpaid.twin
    return plan, first
