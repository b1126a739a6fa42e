"""Keep or reject a measured change: paired A/B step-time ratios, an interval, and the loss check."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.records import median_interval


@dataclass(frozen=True)
class Verdict:
    """The decision on one change and the numbers it rests on."""

    kept: bool
    ratio: float
    interval: tuple[float, float]
    loss_delta: float | None
    why: str


def decide(
    ratios: Sequence[float],
    loss_before: float,
    loss_after: float,
    *,
    loss_tolerance: float,
    needed_to_fit: bool,
) -> Verdict:
    """Keep a change when it is clearly faster (or needed to fit) and the loss stays close.

    Args:
        ratios: step time with the change / without, one per interleaved repeat.
        loss_before: mean loss of the baseline over the measured steps.
        loss_after: mean loss with the change over the same steps, seed and data.
        loss_tolerance: largest accepted relative loss difference.
        needed_to_fit: whether the plan without the change does not fit and with it does.
    """
    ratio = statistics.median(ratios)
    interval = median_interval(ratios)
    scale = max(abs(loss_before), 1e-12)
    delta = abs(loss_after - loss_before) / scale
    if not math.isfinite(loss_after) or delta > loss_tolerance:
        why = f"loss moved {delta:.1%} (> {loss_tolerance:.0%} tolerance)"
        return Verdict(False, ratio, interval, delta, why)
    if interval[1] < 1.0:
        return Verdict(True, ratio, interval, delta, f"faster: x{ratio:.2f} step time")
    if needed_to_fit:
        return Verdict(True, ratio, interval, delta, f"needed to fit (x{ratio:.2f} step time)")
    if interval[0] > 1.0:
        return Verdict(False, ratio, interval, delta, f"slower: x{ratio:.2f} step time")
    return Verdict(False, ratio, interval, delta, f"not clearly faster: x{ratio:.2f} step time")
