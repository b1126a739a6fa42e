"""The records of a confirm session: each change proposed, measured and decided."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from autotune.policy import Predicted
from autotune.records import Plan, Record

SCHEMA_VERSION = 1


class Measured(Record):
    """Interleaved A/B measurement of one change against the plan kept so far."""

    repeats: int
    steps_per_repeat: int
    before_step_s: float = Field(description="median seconds per step without the change")
    after_step_s: float = Field(description="median seconds per step with the change")
    step_time_ratio: float = Field(description="median of paired after/before ratios")
    ratio_interval: tuple[float, float] = Field(description="order-statistic interval, >= 90%")
    loss_before: float
    loss_after: float
    loss_delta: float | None = Field(description="relative difference of mean losses")
    peak_bytes_before: int | None = None
    peak_bytes_after: int | None = None
    source: Literal["measured"] = "measured"


class ConfirmStep(Record):
    """One proposed change and what became of it."""

    rule: str
    change: dict[str, Any]
    plan: Plan
    predicted: Predicted
    measured: Measured | None = None
    status: Literal["kept", "rejected", "not_confirmable", "not_applicable"] = Field(
        description="not_confirmable: needs DeepSpeed engines (tune measures it); "
        "not_applicable: this model file cannot take the change automatically (why says the "
        "code change), so nothing was measured"
    )
    why: str


class ConfirmRecord(Record):
    """The session log of ``autotune confirm``: each change proposed, predicted, measured, decided."""

    schema_version: int = SCHEMA_VERSION
    model_file: str
    device: str
    baseline: Plan
    final_plan: Plan
    loss_tolerance: float
    steps: list[ConfirmStep]
    notes: list[str] = Field(default_factory=list)
