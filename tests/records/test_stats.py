"""The median's interval: its coverage against the binomial law it is built on, checked by
counting, and the relative width tune measures to."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from autotune.records import COVERAGE, median_interval, relative_half_width


@pytest.mark.parametrize("n", [5, 7, 9, 12, 20])
def test_the_interval_covers_the_median_as_often_as_promised(n: int) -> None:
    # Exact coverage by enumeration: each value falls below or above the true median with
    # probability 1/2, independently; the interval (rank j, rank n-1-j) misses the median
    # when fewer than j+1 values fall below it, or fewer than j+1 above.
    values = list(range(n))
    low, high = median_interval(values)
    j = values.index(low)
    assert values.index(high) == n - 1 - j
    misses = sum(
        1 for below in itertools.product((0, 1), repeat=n) if sum(below) <= j or sum(below) >= n - j
    )
    assert 1 - misses / 2**n >= COVERAGE
    # and it is the narrowest such pair: one rank further in would cover less.
    if j + 1 < n - 2 - j:
        inner = sum(1 for below in itertools.product((0, 1), repeat=n)
                    if sum(below) <= j + 1 or sum(below) >= n - j - 1)  # fmt: skip
        assert 1 - inner / 2**n < COVERAGE


def test_the_interval_holds_the_median_of_samples_in_simulation() -> None:
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        sample = [rng.gauss(10.0, 2.0) for _ in range(9)]
        low, high = median_interval(sample)
        hits += low <= 10.0 <= high
    assert hits / 2000 >= COVERAGE - 0.02  # sampling noise of 2000 draws: about 0.007


def test_relative_width_is_half_the_interval_over_the_median() -> None:
    values = [9.0, 10.0, 10.5, 11.0, 12.0]
    low, high = median_interval(values)
    assert relative_half_width(values) == pytest.approx(
        (high - low) / 2 / statistics.median(values)
    )
    assert relative_half_width(values[:3]) is None  # too few for 90 % coverage
    with pytest.raises(ValueError):
        median_interval([])
