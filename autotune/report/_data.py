"""The report's own view of the records: small frozen rows the figures and tables draw from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from autotune.records import Machine

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "other")
"""Memory categories of the stacked bars, bottom to top."""

Outcome = Literal["ok", "oom", "timeout", "crash", "pruned"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "oom", "timeout", "crash", "pruned")


@dataclass(frozen=True)
class MemoryBar:
    """One stacked bar: what was live at the moment of the plan's peak, so it ends at the peak.

    Attributes:
        label: the bar's role (baseline, profiled, a change, the recommendation).
        parts: category -> bytes live at the peak; they add up to the peak the bar stands
            for. Empty when only ``total`` is known.
        source: where the split and the peak come from, e.g. ``measured``.
        total: the bar's height when ``parts`` is empty; otherwise their sum.
        predicted_peak: the peak the cost model predicts for this plan.
        measured_peak: the peak a real run of this plan measured.
        plan: the plan the bar stands for (``Plan.describe()``); ``None``: not known.
        ranks: the ranks that plan runs on; ``None``: not known.
    """

    label: str
    parts: dict[str, int]
    source: str
    total: int | None = None
    predicted_peak: int | None = None
    measured_peak: int | None = None
    plan: str | None = None
    ranks: int | None = None

    @property
    def height(self) -> int | None:
        """Bytes the bar reaches."""
        return sum(self.parts.values()) if self.parts else self.total

    @property
    def caption(self) -> str:
        """The bar's name with the plan and ranks it stands for (one line)."""
        if self.plan is None:
            return self.label
        ranks = "" if self.ranks is None else f", {self.ranks} rank{'s' if self.ranks != 1 else ''}"
        return f"{self.label}: {self.plan}{ranks}"


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
    trial_margin: float | None = None
    """Share of the trials' budget kept free: plans predicted above the rest were pruned."""
    block_activations: list[tuple[str, int]] = field(default_factory=list)
    step_split: StepSplit | None = None
    suggestions: list[SuggestionRow] = field(default_factory=list)
    trials: list[TrialPoint] = field(default_factory=list)
    importances: dict[str, float] | None = None
    recommendation: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def trial_usable_bytes(self) -> float | None:
        """The part of the trials' budget a plan's predicted peak had to fit in."""
        if self.trial_budget_bytes is None or self.trial_margin is None:
            return None
        return Machine(device_memory=self.trial_budget_bytes, margin=self.trial_margin).usable


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
