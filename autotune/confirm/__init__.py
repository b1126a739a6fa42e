"""The confirm stage: the one-change-at-a-time loop with its measurement injected, and the
A/B verdict statistics that keep or reject a change. No torch (``autotune.runtime.ab`` measures).
"""

from __future__ import annotations

from autotune.confirm._loop import IN_PROCESS_KNOBS, IN_PROCESS_PRECISIONS, Measure, confirm_changes
from autotune.confirm._records import ConfirmRecord, ConfirmStep, Measured
from autotune.confirm._verdict import Verdict, decide, median_interval

__all__ = [
    "ConfirmRecord",
    "ConfirmStep",
    "IN_PROCESS_KNOBS",
    "IN_PROCESS_PRECISIONS",
    "Measure",
    "Measured",
    "Verdict",
    "confirm_changes",
    "decide",
    "median_interval",
]
