"""The recommendation record: the plan to use, its evidence, and the code changes it needs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records._base import Record as _Record
from autotune.records._plan import Plan
from autotune.records._profile import Capabilities

SCHEMA_VERSION = 1


class MeasuredPlan(_Record):
    """A plan with what real runs of it measured (medians, and an interval over repeats)."""

    plan: Plan
    samples_per_s: float
    samples_per_s_interval: tuple[float, float] | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    repeats: int = 1


class CodeChange(_Record):
    """A change a DeepSpeed config cannot carry, with the exact lines per framework."""

    what: str = Field(description="e.g. activation checkpointing of blocks 0-11")
    torch: str | None = None
    deepspeed: str | None = None
    hf_trainer: str | None = None
    accelerate: str | None = None


class Recommendation(_Record):
    """The plan to use and why; ``autotune.deepspeed_config(rec)`` gives its DeepSpeed config."""

    schema_version: int = SCHEMA_VERSION
    source: Literal["tune", "suggest", "estimate", "plan"]
    plan: Plan
    model_file: str | None = None
    best: MeasuredPlan | None = None
    baseline: MeasuredPlan | None = None
    speedup: float | None = None
    speedup_interval: tuple[float, float] | None = None
    code_changes: list[CodeChange] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    capabilities: Capabilities | None = Field(
        None, description="the measured device's precision support; None = not measured"
    )
    parameters: int | None = Field(
        None, description="the model's parameter count, which sizes ZeRO's buckets; None = unknown"
    )
    predicted_peak_bytes: int | None = Field(
        None, description="the plan's predicted peak per device (the estimate every road gives)"
    )
    predicted_fits: bool | None = Field(
        None, description="whether that peak fits the budget's usable part; None: no budget"
    )
    predicted_step_seconds: float | None = Field(
        None, description="the plan's predicted seconds per optimizer step; None: not predicted"
    )
    predicted_step_seconds_interval: tuple[float, float] | None = Field(
        None, description="the interval beside it (the estimate's, STEP_SECONDS_BAND)"
    )
