"""How far one trial run's step time sits from its plan's median over runs in separate processes.

Usage: .venv/bin/python bench/run_spread.py [FILE ...]

Reads step-time measurement files as ``bench/step_time.py --measurements`` keeps them (each
plan's median seconds per step, one per round, each round a separate trial process); without
FILE, the four kept in bench/data/. For every plan with two or more runs, each run's |deviation|
from the plan's median, relative to it; prints the median, p75 and p90 per file and over all of
them, beside :data:`autotune.search._records.RUN_SPREAD`, the floor tune puts under a single
run's interval (issue 33).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from autotune.records import AutotuneError, read_json
from autotune.search._records import RUN_SPREAD

KEPT = sorted(
    path
    for path in (Path(__file__).resolve().parent / "data").glob("step_time_*.json")
    if path.suffixes == [".json"]
)


def deviations(measurements: dict[str, dict]) -> list[float]:
    """Each run's |seconds - its plan's median| / median, over the plans run at least twice."""
    found = []
    for model in measurements.values():
        for runs in model.get("seconds", {}).values():
            if len(runs) < 2:
                continue
            middle = statistics.median(runs)
            found += [abs(run - middle) / middle for run in runs]
    return found


def _line(name: str, values: list[float]) -> str:
    if len(values) < 2:
        return f"{name:<34} {len(values):>5} runs: too few"
    q = statistics.quantiles(values, n=20, method="inclusive")
    return (f"{name:<34} {len(values):>5} runs: median {statistics.median(values):6.1%}  "
            f"p75 {q[14]:6.1%}  p90 {q[17]:6.1%}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=KEPT)
    args = parser.parse_args()
    pooled: list[float] = []
    lines = []
    for path in args.files:
        try:
            found = deviations(read_json(path, "measurements"))
        except AutotuneError as error:
            print(f"autotune: {error}", file=sys.stderr)
            return 2
        except (AttributeError, TypeError, ZeroDivisionError):
            print(f"autotune: {path}: not step-time measurements (bench/step_time.py "
                  "--measurements)", file=sys.stderr)  # fmt: skip
            return 2
        pooled += found
        lines.append(_line(path.name, found))
    print("\n".join(lines))
    print(_line("all files", pooled))
    print(f"RUN_SPREAD (tune's floor under a single run's interval): {RUN_SPREAD:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
