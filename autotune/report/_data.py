"""The report's own view of the records: small frozen rows the figures and tables draw from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "other")
"""Memory categories of the stacked bars, bottom to top."""

Outcome = Literal["ok", "oom", "timeout", "crash", "pruned"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "oom", "timeout", "crash", "pruned")


@dataclass(frozen=True)
class MemoryBar:
    """One stacked bar: full bytes per category (not all live at once) and the step's peak.

    Attributes:
        label: what the bar stands for (baseline, a change, the recommendation).
        parts: category -> bytes; empty when only ``total`` is known.
        source: where the parts come from, e.g. ``measured`` or ``formula``.
        total: the bar's height when ``parts`` is empty; otherwise their sum.
        predicted_peak: the peak the cost model predicts for this plan.
        measured_peak: the peak a real run of this plan measured.
    """

    label: str
    parts: dict[str, int]
    source: str
    total: int | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None

    @property
    def height(self) -> int | None:
        """Bytes the bar reaches."""
        return sum(self.parts.values()) if self.parts else self.total


@dataclass(frozen=True)
class StepSplit:
    """Seconds per step by phase (medians); ``other`` is what the phases leave of the step."""

    step: float
    phases: dict[str, float]

    @property
    def other(self) -> float:
        """Step time not covered by the named phases (never negative)."""
        return max(self.step - sum(self.phases.values()), 0.0)


@dataclass(frozen=True)
class SuggestionRow:
    """One suggested change with its evidence, prediction and, once confirmed, measurement."""

    rule: str
    change: str
    reason: str
    evidence: dict[str, object]
    predicted: dict[str, object]
    measured: dict[str, object] | None = None
    kept: bool | None = None
    predicted_ratio: float | None = None
    measured_ratio: float | None = None
    measured_interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class TrialPoint:
    """One trial of a tune run; ``None`` marks what the trial did not measure."""

    number: int
    plan: str
    outcome: Outcome
    samples_per_s: float | None = None
    peak_memory_bytes: int | None = None
    note: str = ""


@dataclass(frozen=True)
class ReportData:
    """Everything one report shows; every part is optional."""

    title: str
    summary: list[tuple[str, str]] = field(default_factory=list)
    memory_bars: list[MemoryBar] = field(default_factory=list)
    budget_bytes: int | None = None
    trial_budget_bytes: int | None = None
    block_activations: list[tuple[str, int]] = field(default_factory=list)
    step_split: StepSplit | None = None
    suggestions: list[SuggestionRow] = field(default_factory=list)
    trials: list[TrialPoint] = field(default_factory=list)
    importances: dict[str, float] | None = None
    recommendation: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pareto_front(trials: list[TrialPoint]) -> list[TrialPoint]:
    """The ok trials no other ok trial beats on both peak memory (lower) and throughput (higher).

    Trials without both figures take no part. Returned sorted by peak memory.
    """
    points = [
        t
        for t in trials
        if t.outcome == "ok" and t.samples_per_s is not None and t.peak_memory_bytes is not None
    ]
    points.sort(key=lambda t: (t.peak_memory_bytes, -(t.samples_per_s or 0.0)))
    front: list[TrialPoint] = []
    best = float("-inf")
    for trial in points:
        speed = trial.samples_per_s or 0.0
        if speed > best:
            front.append(trial)
            best = speed
    return front
