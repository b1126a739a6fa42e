"""The one home of the interval statistics every stage reports: a distribution-free interval
for a median (order statistics), and whether a median is known to a given relative width.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

COVERAGE = 0.9
"""Coverage of every interval autotune reports for a median."""


def median_interval(values: Sequence[float], coverage: float = COVERAGE) -> tuple[float, float]:
    """A distribution-free interval for the median: order statistics from the binomial(n, 1/2).

    With few values it widens to (min, max), which for n = 5 covers the median
    with probability 1 - 2 / 2**5 = 0.94.
    """
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values")
    lower = 0
    # Widen inwards while the two tails together stay below 1 - coverage.
    while lower + 1 < n - lower - 1 and 2 * _binomial_tail(n, lower + 2) <= 1 - coverage:
        lower += 1
    return ordered[lower], ordered[n - 1 - lower]


def _binomial_tail(n: int, k: int) -> float:
    """P(X < k) for X ~ binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n


def min_count_for_coverage(coverage: float = COVERAGE) -> int:
    """Fewest values whose (min, max) covers the median with at least ``coverage``."""
    n = 1
    while 1 - 2 / 2**n < coverage:
        n += 1
    return n


def relative_half_width(values: Sequence[float], coverage: float = COVERAGE) -> float | None:
    """Half the median's interval over the median (``None``: too few values for ``coverage``)."""
    if len(values) < min_count_for_coverage(coverage):
        return None
    low, high = median_interval(values, coverage)
    middle = statistics.median(values)
    return (high - low) / 2 / middle if middle > 0 else None
