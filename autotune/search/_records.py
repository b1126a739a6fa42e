"""The records a tune run passes around: trial spec, worker result, trial and tune records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records import TRIAL_TIMEOUT_S, BlockStack, MeasuredPlan, Plan, Recommendation
from autotune.records import Record as _Record

SCHEMA_VERSION = 1

Outcome = Literal["ok", "oom", "timeout", "crash"]
TrialState = Literal["complete", "pruned", "failed", "running", "waiting"]
Role = Literal["policy", "baseline", "predicted", "search"]


class TrialSettings(_Record):
    """What every trial of one study shares: the model, the step counts, the budget."""

    model_file: str
    steps: int = Field(default=3, ge=1, description="measured optimizer steps")
    warmup: int = Field(default=1, ge=0, description="optimizer steps run first and dropped")
    device: str = Field(default="auto", description="auto, cpu or cuda")
    device_memory: int | None = Field(default=None, description="budget per device in bytes")
    memory_guard: int | None = Field(
        None, description="RSS per rank above which the worker stops itself (protects the machine)"
    )
    timeout_s: float = Field(default=TRIAL_TIMEOUT_S, gt=0, description="hard limit per launch")
    seed: int = 0
    interval_width: float | None = Field(
        default=None,
        gt=0,
        description="keep measuring until the median step time's interval is within this "
        "relative half-width (0.05: +-5 %); None: exactly `steps` steps",
    )
    max_steps: int = Field(default=20, ge=1, description="cap on measured steps (with a width)")
    max_measure_s: float = Field(
        default=15.0, gt=0, description="cap on seconds of measured steps (with a width)"
    )


class WorkerSpec(_Record):
    """The file a trial worker reads: the settings, the plan, where to write the result."""

    settings: TrialSettings
    plan: Plan
    result_path: str
    warmup_only: bool = Field(
        default=False, description="only pay launcher start-up (comm-op compile)"
    )


class StepSplit(_Record):
    """Median seconds per optimizer step, by phase (plain-torch trials only)."""

    dataloader: float
    forward: float
    backward: float
    optimizer: float


class TrialResult(_Record):
    """What rank 0 of a trial writes; ``None`` means not measured."""

    completed_steps: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = Field(default=None, description="median seconds per optimizer step")
    step_times: list[float] = Field(default_factory=list)
    step_interval: tuple[float, float] | None = Field(
        default=None, description="the median step time's interval (order statistics, >= 90 %)"
    )
    split: StepSplit | None = None
    peak_memory_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: the peak a budget check and the estimate use",
    )
    peak_source: str | None = Field(
        default=None,
        description="cuda_max_allocated; on CPU cpu_allocator (a plain torch trial, as "
        "`autotune profile` measures) or cpu_live_tensors (DeepSpeed, FSDP2); or cpu_rss_delta "
        "where neither could be measured",
    )
    live_tensor_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: the peak of one extra, untimed step by peak_source's CPU "
        "measure (empty: not measured)",
    )
    rss_delta_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: process RSS growth since the model file loaded; "
        "includes allocator caches and library memory, so larger than the peak",
    )
    device_memory: int | None = Field(
        default=None, description="the budget the peak is judged against"
    )
    loss_first: float | None = None
    loss_last: float | None = None
    engine: Literal["torch", "deepspeed", "fsdp2", "none"] = "torch"
    error: str | None = Field(
        default=None, description="exception type and message, if the step raised"
    )
    first_step_at: float | None = Field(
        default=None, description="wall clock (time.time) when the first step began"
    )
    steps_s: float | None = Field(
        default=None, description="seconds of all steps run (warm-up and measured)"
    )
    reused: bool = Field(
        default=False, description="whether the worker process had run a trial before this one"
    )

    @property
    def peak(self) -> int | None:
        """The largest per-rank peak, the figure a budget check uses."""
        return max(self.peak_memory_bytes) if self.peak_memory_bytes else None


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
