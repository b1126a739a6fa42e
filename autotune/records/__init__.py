"""The records every stage passes along (plan, profile, recommendation), plus what they all need:
the one error type, atomic JSON I/O and unit parsing. No stage logic lives here.
"""

from __future__ import annotations

from autotune.records._base import Record
from autotune.records._errors import AutotuneError, NotApplicable, Terminated, sigterm_unwinds
from autotune.records._io import (
    RecordT,
    atomic_write_bytes,
    atomic_write_text,
    check_version,
    read_json,
    read_record,
    validate_record,
    write_record,
)
from autotune.records._plan import (
    AUTOCAST_PLAN_PRECISION,
    Attention,
    Offload,
    Plan,
    Precision,
    format_plan,
    fsdp2_equivalent,
    parse_plan,
)
from autotune.records._profile import (
    ActivationFit,
    AtPeak,
    BlockStack,
    Capabilities,
    Compute,
    Environment,
    MemoryBreakdown,
    ModelInfo,
    ModuleBytes,
    NvmlSample,
    ProfileConfig,
    ProfileRecord,
    Provenance,
    Spread,
    StepTime,
    Throughput,
)
from autotune.records._recommendation import CodeChange, MeasuredPlan, Recommendation
from autotune.records._stats import COVERAGE, median_interval, relative_half_width
from autotune.records._units import (
    format_bytes,
    format_count,
    format_flops,
    parse_bytes,
    parse_count,
)

__all__ = [
    "AUTOCAST_PLAN_PRECISION",
    "COVERAGE",
    "ActivationFit",
    "AtPeak",
    "Attention",
    "AutotuneError",
    "BlockStack",
    "Capabilities",
    "CodeChange",
    "Compute",
    "Environment",
    "MeasuredPlan",
    "MemoryBreakdown",
    "ModelInfo",
    "ModuleBytes",
    "NotApplicable",
    "NvmlSample",
    "Offload",
    "Plan",
    "Precision",
    "ProfileConfig",
    "ProfileRecord",
    "Provenance",
    "Recommendation",
    "Record",
    "RecordT",
    "Spread",
    "StepTime",
    "Terminated",
    "Throughput",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_version",
    "format_bytes",
    "format_count",
    "format_flops",
    "format_plan",
    "median_interval",
    "fsdp2_equivalent",
    "parse_bytes",
    "parse_count",
    "parse_plan",
    "read_json",
    "read_record",
    "sigterm_unwinds",
    "relative_half_width",
    "validate_record",
    "write_record",
]
