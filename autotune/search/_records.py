"""The records a tune run passes around: trial spec, worker result, trial and tune records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records import (
    BlockStack,
    LinkMeasure,
    MeasuredPlan,
    Plan,
    Recommendation,
    TrialResult,
)
from autotune.records import Record as _Record

SCHEMA_VERSION = 1

RUN_SPREAD = 0.055
"""How far one run's samples/s sits from its plan's median over runs in separate processes: the
median over the 256 runs of four models kept in bench/data/ (GPT-2 small, a zoo BERT, a 12.6M
Llama and tiny Llama, 32 plans each, two runs a plan; ``bench/run_spread.py`` prints it; p90
13 %). A run's own interval, from its own steps in one process, shows none of that spread (issue
33: a tiny-Llama tune's single run of its pick came 9 % above that plan's median over five
re-runs), so a single run's samples/s interval is at least this wide either side.
Held out, tiny GPT's 64 runs (two rounds within 2 minutes, an AMX Xeon) sit closer: 2.4 %."""

Outcome = Literal["ok", "oom", "timeout", "crash"]
TrialState = Literal["complete", "pruned", "failed", "running", "waiting"]
Role = Literal["policy", "unchanged", "baseline", "predicted", "neighbour", "search"]
"""Why a trial was queued; ``unchanged``: the policy's plan with the model's code as written
(no fused attention or compile), measured beside it to decide those changes for the search."""


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
    link: LinkMeasure | None = Field(
        default=None,
        description="the link between the trial's ranks, swept after its steps (multi-rank)",
    )


class Comparison(_Record):
    """The final comparison: the search's runs of the best plan and of those whose intervals
    overlap it, re-run interleaved until the intervals separate; medians and ranges."""

    repeats: int = Field(description="rounds of interleaved re-runs (0: nothing re-run)")
    measured: list[MeasuredPlan]
    labels: list[str] = Field(
        description="what each measured entry is: search best, baseline, runner-up, contender"
    )
    reruns: list[int] | None = Field(
        default=None,
        description="re-runs of each entry (0: its search run only; None: an older record, "
        "where every entry was re-run ``repeats`` times)",
    )
    cap: int | None = Field(default=None, description="the most rounds allowed (--repeats)")
    stopped: str | None = Field(default=None, description="why the re-runs stopped where they did")
    winner: int = Field(
        default=0, ge=0, description="index of the highest median: the recommended plan"
    )
    speedup: float | None = None
    speedup_interval: tuple[float, float] | None = None


class WallTime(_Record):
    """Where one ``autotune tune`` run's wall time went, in seconds (``None``: not measured)."""

    profile_s: float | None = Field(default=None, description="profiling the model")
    startup_s: float | None = Field(
        default=None, description="starting the trial workers before the first trial"
    )
    trials_s: float | None = Field(default=None, description="the search's trials")
    comparison_s: float | None = Field(default=None, description="the final comparison")
    other_s: float = Field(description="everything else: the total less the phases above")
    total_s: float

    @classmethod
    def of(cls, *, total_s: float, **phases: float | None) -> WallTime:
        """The breakdown with ``other_s`` the rest of ``total_s``."""
        known = sum(value for value in phases.values() if value is not None)
        return cls(total_s=total_s, other_s=max(total_s - known, 0.0), **phases)  # type: ignore[arg-type]

    def with_phases(self, *, total_s: float, **more: float) -> WallTime:
        """This breakdown inside a longer run: ``more`` added to its phases, the rest ``other``."""
        phases = {
            name: (getattr(self, name) or 0.0) + more.get(name, 0.0)
            for name in ("profile_s", "startup_s", "trials_s", "comparison_s")
        }
        return WallTime.of(total_s=total_s, **phases)

    def describe(self) -> str:
        """One line: the total, then each phase measured."""
        parts = [
            f"{label} {_seconds(value)}"
            for label, value in (
                ("profile", self.profile_s),
                ("start-up", self.startup_s),
                ("trials", self.trials_s),
                ("comparison", self.comparison_s),
                ("other", self.other_s),
            )  # fmt: skip
            if value is not None
        ]
        return f"{_seconds(self.total_s)} = " + " + ".join(parts)


def _seconds(value: float) -> str:
    minutes, seconds = divmod(value, 60)
    return f"{int(minutes)} min {seconds:.0f} s" if minutes else f"{seconds:.1f} s"


class TuneRecord(_Record):
    """Everything one ``autotune tune`` run decided and measured."""

    schema_version: int = SCHEMA_VERSION
    model_file: str
    study: str
    storage: str
    global_batch: int
    nproc_per_node: int = Field(description="ranks per node of each trial")
    nnodes: int = Field(1, description="nodes of each trial")
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
    link: LinkMeasure | None = Field(
        default=None,
        description="the link between the trials' ranks, as the first multi-rank trial swept "
        "it: the predictions after it time communication on it (None: one rank per trial)",
    )
    wall_time: WallTime | None = Field(
        None, description="where the run's wall time went (None: an older record)"
    )
