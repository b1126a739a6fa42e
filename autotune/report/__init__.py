"""The HTML report: memory, step time, suggestions and trials as pictures with their numbers."""

from __future__ import annotations

from autotune.report._build import (
    Report,
    ReportInputs,
    ReportRecord,
    build_report,
    collect,
    render,
    write_report,
)
from autotune.report._data import pareto_front
from autotune.report._load import load_inputs

__all__ = [
    "Report",
    "ReportInputs",
    "ReportRecord",
    "build_report",
    "collect",
    "load_inputs",
    "pareto_front",
    "render",
    "write_report",
]
