"""The tune search: trial runners, outcome classification, the Optuna study and ``tune()``."""

from autotune.search._outcome import classify_outcome, outcome_reason, over_budget
from autotune.search._records import (
    Comparison,
    RunReport,
    TrialRecord,
    TrialResult,
    TrialSettings,
    TuneRecord,
    WorkerSpec,
)
from autotune.search._runner import FakeRunner, SubprocessRunner, TrialRunner
from autotune.search._space import Prediction, SearchSpace, divisors, make_space, oom_lesson
from autotune.search._tune import Progress, best_records, tune

__all__ = [
    "Comparison",
    "FakeRunner",
    "Prediction",
    "Progress",
    "RunReport",
    "SearchSpace",
    "SubprocessRunner",
    "TrialRecord",
    "TrialResult",
    "TrialRunner",
    "TrialSettings",
    "TuneRecord",
    "WorkerSpec",
    "best_records",
    "classify_outcome",
    "divisors",
    "make_space",
    "oom_lesson",
    "outcome_reason",
    "over_budget",
    "tune",
]
