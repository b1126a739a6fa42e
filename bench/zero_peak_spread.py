"""How often a 2-rank ZeRO trial's per-rank peak moves between runs of the same plan.

Runs the same trial (autotune's ``SubprocessRunner``, live tensor bytes per rank, as
``bench/zero_peaks.py`` measures it) ``--repeats`` times alone, then ``--repeats`` times with a
second copy of the same trial running beside it (another 2 ranks on the same cores), and
prints every distinct per-rank peak with how often it was seen, and its distance from the
lowest in bytes and in fp32 gradient partitions (4 * parameters / ranks bytes).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/zero_peak_spread.py --plan stage=2,mb=8,ga=2 \\
         [--repeats 5]
The model is the test suite's 3-block MLP (``tests/_models.py``, width 64, hidden 256).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="stage=2,mb=8,ga=2")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from _models import mlp_stack
    from zero_peaks import _trial_peaks

    from autotune.records import parse_plan

    plan = parse_plan(f"{args.plan},nproc_per_node=2")
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "mlp.py"
        model.write_text(mlp_stack(blocks=3, width=64, hidden=256))
        built = runpy.run_path(str(model))["build_model"]()
        params = sum(p.numel() for p in built.parameters())
        seen: dict[str, list[int]] = {"alone": [], "beside another": []}
        for _ in range(args.repeats):
            seen["alone"] += _trial_peaks(str(model), [plan], work / "a")[0]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(args.repeats):
                pair = [pool.submit(_trial_peaks, str(model), [plan], work / f"b{i}")
                        for i in range(2)]  # fmt: skip
                seen["beside another"] += _trial_peaks_of(pair)
    partition = 4 * params / 2
    floor = min(min(v) for v in seen.values())
    print(f"plan {plan.describe()}; {params:,} parameters; fp32 gradient partition "
          f"{partition:,.0f} B; {args.repeats} trials each way, 2 ranks each")  # fmt: skip
    print()
    print("| how run | rank peak (B) | rank-peaks seen | above the lowest (B) | in partitions |")
    print("|---|---|---|---|---|")
    for how, peaks in seen.items():
        for value, count in sorted(collections.Counter(peaks).items()):
            above = value - floor
            print(f"| {how} | {value:,} | {count} of {len(peaks)} | {above:,} | "
                  f"{above / partition:.2f} |")  # fmt: skip
    print()
    print(f"{time.time() - started:.0f} s; command: {' '.join(sys.argv)}")


def _trial_peaks_of(pair: list[concurrent.futures.Future[list[list[int]]]]) -> list[int]:
    return [value for future in pair for value in future.result()[0]]


if __name__ == "__main__":
    main()
