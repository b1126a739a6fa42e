"""Question: how long does `autotune report` take to draw its page, and how large is the page?

Renders the report library call (no CLI start-up) for a profile alone, for a full set of
inputs with 8 trials, and with 200 trials; prints the median of interleaved repeats and
the HTML size. Run: OMP_NUM_THREADS=1 .venv/bin/python bench/report_render.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / p) for p in ("report", "")]

from test_report_samples import (  # noqa: E402
    make_confirm,
    make_profile,
    make_suggestions,
    make_trials,
    make_tune,
)

from autotune.records import Plan  # noqa: E402
from autotune.report import ReportInputs, build_report  # noqa: E402

REPEATS = 5


def _many_trials(count: int) -> list:  # type: ignore[type-arg]
    base = make_trials()
    out = []
    for number in range(count):
        trial = base[number % len(base)]
        plan = Plan(micro_batch=1 + number % 32, checkpoint_blocks=number % 5)
        speed = None if trial.samples_per_s is None else trial.samples_per_s * (1 + number % 7 / 10)
        out.append(
            trial.model_copy(update={"number": number, "plan": plan, "samples_per_s": speed})
        )
    return out


def main() -> None:
    suggestions = make_suggestions()
    full = {
        "profile": make_profile(),
        "suggestions": suggestions,
        "confirm": make_confirm(suggestions),
    }
    cases = {
        "profile only": ReportInputs(profile=make_profile()),
        "full, 8 trials": ReportInputs(**full, tune=make_tune()),
        "full, 200 trials": ReportInputs(
            **full, tune=make_tune().model_copy(update={"trials": _many_trials(200)})
        ),
    }
    build_report(cases["profile only"])  # import and font-cache warm-up, not timed
    times: dict[str, list[float]] = {name: [] for name in cases}
    sizes: dict[str, int] = {}
    for _ in range(REPEATS):
        for name, inputs in cases.items():
            start = time.perf_counter()
            report = build_report(inputs)
            times[name].append(time.perf_counter() - start)
            sizes[name] = len(report.html.encode())
    print(f"{'case':<18} {'median s':>9} {'min s':>7} {'max s':>7} {'HTML KiB':>9}")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:<18} {median:>9.2f} {min(values):>7.2f} {max(values):>7.2f} {sizes[name] / 1024:>9.0f}"
        )


if __name__ == "__main__":
    main()
