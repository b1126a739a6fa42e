"""Physical bounds of a profile's measured figures: a figure outside them cannot be true.

A busy machine skews one timing more than another, so a ratio of two timings or a rate over a
measured peak can come out impossible (MFU 161 %, bf16 matmul 56.7x fp32 on a CPU). Such a figure
is flagged, and the policy never takes it as evidence. Pure data and checks, no torch.
"""

from __future__ import annotations

from autotune.estimator._device_flops import DENSE_PEAKS
from autotune.records import ProfileRecord

MFU_FIGURE = "compute.mfu"
HFU_FIGURE = "compute.hfu"
BF16_RATIO_FIGURE = "environment.capabilities.bf16_fp32_speed_ratio"
SPREAD_FIGURE = "time.spread"
"""The figures checked, by their dotted key in the profile record (the keys of its ``flags``)."""

FACT_OF_FIGURE = {BF16_RATIO_FIGURE: "bf16_speed_ratio"}
"""The policy fact each checked figure becomes (a flagged one becomes unknown)."""

UTILISATION_RANGE = (0.0, 1.0)
"""MFU and HFU lie in (0, 1]: no device runs above its peak. Above 1, the peak was measured
slower than the step ran (a matmul benchmark on a loaded machine) or is no peak."""

CPU_BF16_RATIO_MAX = 16.0
"""A CPU's bf16 matmul over its fp32: Intel documents AMX-BF16 at 1024 FLOPs per cycle per core
and AVX-512 fp32 at 64 (two 16-lane FMA units), 16x at most (Intel 64 and IA-32 Architectures
Optimization Reference Manual, AMX chapter). Measured here: ~2.4-2.5x on AMX machines."""

GPU_BF16_RATIO_MAX = 1.25 * max(
    peaks["bf16"] / peaks["fp32"] for _, peaks in DENSE_PEAKS if "bf16" in peaks and "fp32" in peaks
)
"""A GPU's dense bf16 tensor-core peak over its fp32 (non-TF32) peak is at most 16x in the
datasheet table (A100: 312 / 19.5 TFLOPS; H100 SXM: 989 / 67, 14.8x), with a quarter more for an
fp32 matmul that reaches less of its peak than bf16 does: 20x."""

BF16_RATIO_MIN = 1e-3
"""bf16 emulated without AVX512-BF16 runs 6-100x slower than fp32; 1000x slower is a stall,
not a kernel."""

BF16_RATIO_RANGE = {"cpu": (BF16_RATIO_MIN, CPU_BF16_RATIO_MAX),
                    "cuda": (BF16_RATIO_MIN, GPU_BF16_RATIO_MAX)}  # fmt: skip
"""The physically possible bf16/fp32 matmul speed ratio per device kind."""

SPREAD_MAX = 1.0
"""Step times whose range (max - min) exceeds their median were not measured on a quiet machine
(run-to-run noise on a shared 2-core machine is about +-15 %, max/min 1.35x)."""


def utilisation_problem(name: str, value: float | None) -> str | None:
    """Why an MFU or HFU (``name``) cannot be true, or ``None`` when it can (or is unknown)."""
    low, high = UTILISATION_RANGE
    if value is None or low < value <= high:
        return None
    if value > high:
        return (f"impossible: {name} {value:.1%} > 100% (no device runs above its peak; the peak "
                "was measured slower than the step ran, e.g. on a busy machine)")  # fmt: skip
    return f"impossible: {name} {value:.3g} <= 0"


def bf16_ratio_problem(ratio: float | None, device_type: str) -> str | None:
    """Why a measured bf16/fp32 matmul speed ratio cannot be true on ``device_type``, or ``None``."""
    low, high = BF16_RATIO_RANGE.get(device_type, BF16_RATIO_RANGE["cuda"])
    if ratio is None or low <= ratio <= high:
        return None
    kind = "CPU" if device_type == "cpu" else "GPU"
    return (f"impossible: bf16/fp32 matmul {ratio:.3g}x is outside a {kind}'s physical range "
            f"[{low:g}, {high:g}] (one of the two matmuls ran on a busy machine)")  # fmt: skip


def spread_problem(low: float, median: float, high: float) -> str | None:
    """Why step times from ``low`` to ``high`` around ``median`` are suspect, or ``None``."""
    if median <= 0 or (high - low) / median <= SPREAD_MAX:
        return None
    return (f"suspect: step times range {(high - low) / median:.2f}x their median (over "
            f"{SPREAD_MAX:g}x: a busy machine or steps that differ); re-profile on a quiet one")  # fmt: skip


def check_figures(profile: ProfileRecord) -> dict[str, str]:
    """The profile's figures outside their physical bounds: dotted key -> why."""
    spread = profile.time.spread
    problems = {
        MFU_FIGURE: utilisation_problem("MFU", profile.compute.mfu),
        HFU_FIGURE: utilisation_problem("HFU", profile.compute.hfu),
        BF16_RATIO_FIGURE: bf16_ratio_problem(
            profile.environment.capabilities.bf16_fp32_speed_ratio, profile.config.device
        ),
        SPREAD_FIGURE: spread_problem(spread.min, spread.median, spread.max),
    }
    return {key: why for key, why in problems.items() if why is not None}


def flagged_figures(profile: ProfileRecord) -> dict[str, str]:
    """The figures of ``profile`` not to use as evidence: those it flagged when measured, and
    those outside their bounds now (an older record has no flags of its own)."""
    return {**check_figures(profile), **profile.flags}
