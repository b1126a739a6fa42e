"""How far one trial run's step time sits from its plan's median over runs in separate processes.

Usage: .venv/bin/python bench/run_spread.py [FILE ...] [--held-out FILE ...]

Reads step-time measurement files as ``bench/step_time.py --measurements`` keeps them (each
plan's median seconds per step, one per round, each round a separate trial process); without
FILE, the four in bench/data/ that :data:`autotune.search._records.RUN_SPREAD` was taken from.
For every plan with two or more runs, each run's |deviation| from the plan's median, relative to
it; prints the median, p75 and p90 per file and over all of them, beside ``RUN_SPREAD``, the
floor tune puts under a single run's interval (issue 33). ``--held-out`` files are printed
after, each alone, and left out of the pooled line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from autotune.records import AutotuneError, read_json
from autotune.search._records import RUN_SPREAD

DATA = Path(__file__).resolve().parent / "data"
FITTED = [DATA / f"step_time_{name}.json" for name in ("124m", "bert", "llama_s512", "tiny_llama")]
"""The files ``RUN_SPREAD`` is the pooled median of."""


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
    parser.add_argument("files", nargs="*", type=Path, default=FITTED)
    parser.add_argument("--held-out", nargs="+", type=Path, default=[], metavar="FILE")
    args = parser.parse_args()
    try:
        read = {path: _read(path) for path in [*args.files, *args.held_out]}
    except AutotuneError as error:
        print(f"autotune: {error}", file=sys.stderr)
        return 2
    pooled = [value for path in args.files for value in read[path]]
    print("\n".join(_line(path.name, read[path]) for path in args.files))
    print(_line("all files above", pooled))
    print(f"RUN_SPREAD (tune's floor under a single run's interval): {RUN_SPREAD:.1%}")
    for path in args.held_out:
        print(_line(f"held out: {path.name}", read[path]))
    return 0


def _read(path: Path) -> list[float]:
    """``path``'s deviations; an unreadable file or one of another shape: AutotuneError."""
    try:
        return deviations(read_json(path, "measurements"))
    except (AttributeError, TypeError, ZeroDivisionError):
        raise AutotuneError(
            f"{path}: not step-time measurements (bench/step_time.py --measurements)"
        ) from None


if __name__ == "__main__":
    sys.exit(main())
