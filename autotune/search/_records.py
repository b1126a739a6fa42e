"""The records a tune run passes around: trial spec, worker result, trial and tune records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records import (
    BlockStack,
    MeasuredPlan,
    Plan,
    Recommendation,
    TrialResult,
)
from autotune.records import Record as _Record

SCHEMA_VERSION = 1

Outcome = Literal["ok", "oom", "timeout", "crash"]
TrialState = Literal["complete", "pruned", "failed", "running", "waiting"]
Role = Literal["policy", "baseline", "predicted", "search"]


class RunReport(_Record):
    """One launch as the parent saw it, before classification."""

    returncode: int | None
    timed_out: bool
    result: TrialResult | None
    stderr_tail: str = ""
    duration_s: float
    launches: int = Field(
        1, description="launch attempts, retries after rendezvous failures included"
    )
    fixed_s: float | None = Field(
        default=None,
        description="seconds from the request (a launch, or a request to a live worker) "
        "to the start of the trial's first step: start-up, model and engine build",
    )

    def with_fixed_cost(self, requested_at: float) -> RunReport:
        """This report with ``fixed_s`` from the wall-clock time the trial was requested."""
        first = self.result.first_step_at if self.result is not None else None
        fixed = max(first - requested_at, 0.0) if first is not None else None
        return self.model_copy(update={"fixed_s": fixed})


class TrialRecord(_Record):
    """One trial of the study: the plan, what happened, what it measured."""

    number: int
    plan: Plan
    role: Role = "search"
    state: TrialState
    outcome: Outcome | None = None
    reason: str | None = Field(default=None, description="why pruned or failed")
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = None
    peak_memory_bytes: int | None = None
    peak_source: str | None = None
    predicted_peak_bytes: int | None = None
    prediction_source: str | None = None
    stderr_tail: str | None = None
    duration_s: float | None = None
    fixed_s: float | None = Field(
        default=None, description="request to first step: start-up, model and engine build"
    )
    steps_s: float | None = Field(default=None, description="seconds of the trial's steps")
    steps_measured: int | None = None
    step_interval: tuple[float, float] | None = Field(
        default=None, description="the median step time's interval (order statistics, >= 90 %)"
    )
    reused_worker: bool | None = Field(
        default=None, description="whether a live worker from an earlier trial ran it"
    )
    predicted_step_ratio: float | None = Field(
        default=None, description="predicted step time over the baseline's (the estimate)"
    )


class Comparison(_Record):
    """The final interleaved re-runs: medians and ranges over repeats."""

    repeats: int
    measured: list[MeasuredPlan]
    labels: list[str] = Field(
        description="what each measured entry is: search best, baseline, runner-up"
    )
    winner: int = Field(
        default=0, ge=0, description="index of the highest median: the recommended plan"
    )
    speedup: float | None = None
    speedup_interval: tuple[float, float] | None = None


class TuneRecord(_Record):
    """Everything one ``autotune tune`` run decided and measured."""

    schema_version: int = SCHEMA_VERSION
    model_file: str
    study: str
    storage: str
    global_batch: int
    nproc: int = Field(description="ranks per node of each trial")
    nodes: int = Field(1, description="nodes of each trial")
    device_memory: int | None
    margin: float | None = Field(
        None, description="share of device_memory the search kept free (None: not recorded)"
    )
    objective: Literal["tokens_per_s", "samples_per_s"]
    trials: list[TrialRecord]
    comparison: Comparison | None = None
    recommendation: Recommendation | None = None
    block_stack: BlockStack | None = Field(
        None, description="the model's blocks, which the FSDP2 config wraps and checkpoints"
    )
    notes: list[str] = Field(default_factory=list)
