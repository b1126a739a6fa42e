"""The records the advisor returns: suggestions with their evidence and predicted effect."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from autotune.records import Plan, Record

SCHEMA_VERSION = 1


class Evidence(Record):
    """One fact a rule tested, with its value and where the value came from."""

    value: Any
    source: Literal["measured", "formula", "traced", "given", "plan", "refused"] = Field(
        description="refused: the profile's figure cannot be true (a note says why), so unknown"
    )


class Predicted(Record):
    """The predicted effect of one change, relative to the plan before it."""

    peak_bytes_before: int | None
    peak_bytes_after: int | None
    fits_after: bool | None
    step_time_ratio: float | None = Field(
        description="step time after / before; < 1 is faster. A change of the samples per "
        "step (micro-batch x accumulation) is compared per sample"
    )
    step_seconds_after: float | None = Field(
        default=None,
        description="predicted seconds per optimizer step of the plan after; None: not "
        "predicted (no profile at the plan's precision, or a figure it cannot scale)",
    )
    step_seconds_interval_after: tuple[float, float] | None = Field(
        default=None,
        description="the interval beside step_seconds_after (the estimator's STEP_SECONDS_BAND)",
    )
    samples_per_s_per_device_after: float | None = Field(
        default=None,
        description="samples each device trains per second after: micro-batch x accumulation "
        "/ step_seconds_after",
    )
    memory_source: Literal["measured", "formula", "traced"]
    time_source: Literal["measured", "formula", "traced"] | None
    host_bytes_after: int = Field(
        default=0, description="host RAM per node the plan's offloaded states take (0: none)"
    )
    host_fits_after: bool | None = Field(
        default=True, description="those fit the host memory; None: not known"
    )
    offload_bytes_per_step: int = Field(
        default=0, description="host-device bytes per optimizer step the offload moves"
    )
    offload_seconds: float | None = Field(
        default=None,
        description="their transfer time over the host link; None: no --pcie-gbps given",
    )
    host_optimizer_seconds: float | None = Field(
        default=None,
        description="the optimizer's step on the host's CPU (the profile's probed Adam rate); "
        "None: nothing offloaded, or the profile probed no rate",
    )


class Suggestion(Record):
    """One proposed change: the rule, the knobs it turns, the stacked plan, why, and what it should do."""

    rule: str
    change: dict[str, Any]
    plan: Plan
    plan_text: str
    evidence: dict[str, Evidence]
    predicted: Predicted
    reason: str
    fsdp2_alternative: str | None = Field(
        None,
        description="with --framework torch|accelerate: the engine=fsdp2 plan doing this "
        "ZeRO stage with PyTorch's fully_shard (None: not asked, or no FSDP2 form)",
    )


class SuggestRecord(Record):
    """What ``autotune suggest`` proposes, in order: the first suggestion is the next change."""

    schema_version: int = SCHEMA_VERSION
    profile: str | None = None
    policy: str
    baseline: Plan
    device_memory_bytes: int | None
    budget_source: Literal["given", "device", "available_ram"] | None = Field(
        default=None,
        description="where the budget came from: --device-memory, the profiled GPU, or this "
        "machine's available memory for a CPU profile",
    )
    world_size: int
    nproc_per_node: int
    inter_gbps: float | None
    margin: float = Field(
        default=0.10, description="share of the budget kept free when deciding what fits"
    )
    global_batch: int | None
    global_batch_kept: bool = Field(
        default=True,
        description="False: the final plan's global batch (micro-batch x accumulation x world "
        "size) differs from the target global batch; a note says what it gives and why. "
        "`autotune suggest` then exits 1",
    )
    suggestions: list[Suggestion]
    final_plan: Plan
    final_predicted: Predicted | None = Field(
        default=None,
        description="the final plan against the baseline: peak, fit, seconds per step and "
        "samples/s per device (with no suggestion, the baseline's own figures)",
    )
    notes: list[str] = Field(default_factory=list)
    framework: str | None = Field(None, description="the user's framework, when given")
