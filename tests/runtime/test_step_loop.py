"""The trial's step loop: how many steps it measures, against a scripted clock.

Each scripted step returns its seconds; the loop's rule (``Steps._enough``) decides when the
median is known. A trial told the best measured plan's step time stops once its median's
interval lies above it, and only then."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from autotune.records import Plan, TrialResult, TrialSettings, WorkerSpec
from autotune.runtime.trial.steps import Steps

NOISY = [1.2, 0.9, 1.4, 0.95, 1.3, 0.85] * 4
"""Steps whose median's interval never narrows to +-5 % within 20 (they alternate by +-25 %)."""


def _measured(seconds: list[float], stop_slower_than_s: float | None) -> list[float]:
    settings = TrialSettings(model_file="m.py", device="cpu", steps=3, warmup=1, max_steps=20,
                             max_measure_s=1e9, interval_width=0.05,
                             stop_slower_than_s=stop_slower_than_s)  # fmt: skip
    spec = WorkerSpec(settings=settings, plan=Plan(), result_path="r")
    written: list[TrialResult] = []
    loop = Steps(spec, written.append, watch=None)  # type: ignore[arg-type]
    clock: Iterator[float] = iter([5.0, *seconds])  # the warm-up step, then the measured ones
    step: Callable[[], tuple[float, float]] = lambda: (next(clock), 1.0)  # noqa: E731
    loop.run(step)
    return loop.times


def test_a_plan_slower_than_the_best_measured_stops_after_the_fewest_steps() -> None:
    slow = [x * 2 for x in NOISY]  # every step 1.7 s or more, the best's top at 1.5 s
    assert _measured(slow, 1.5) == slow[:3]
    assert len(_measured(slow, None)) == 20  # without the bound: to the cap


def test_a_plan_whose_interval_reaches_the_best_is_measured_as_before() -> None:
    # the same steps under a bound they straddle (0.85 to 1.4 against 1.0): to the cap
    assert len(_measured(NOISY, 1.0)) == 20
    # one fast step among slow ones: the 90 % interval of the median of 3 to 7 values starts at
    # the smallest (0.9 s, under the bound); of 8, at the second smallest (binomial(8, 1/2):
    # 2 P(X <= 1) = 18/256 <= 10 %), 1.7 s: the eighth step is the last
    mixed = [1.8, 0.9, 1.7, 1.9, 1.8, 2.0, 1.75, 1.85, 1.9, 1.8] + NOISY
    assert _measured(mixed, 1.5) == mixed[:8]
