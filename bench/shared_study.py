"""Wall time of one study run by two `autotune tune` workers against one worker, same trial budget.

Usage: python bench/shared_study.py examples/mlp_dataloader.py --global-batch 8 \
           [--trials 6] [--repeats 3] [--storage-dir DIR | --postgres URL]

Each run is a fresh study; the two set-ups alternate (which goes first alternates too), and
the medians of the repeats are compared, with min-max ranges. Workers get OMP_NUM_THREADS=1
and, where the machine has enough CPUs, disjoint CPU sets (``os.sched_setaffinity``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def run_study(model: str, args: argparse.Namespace, workers: int, folder: Path) -> float:
    """Seconds from starting ``workers`` workers on a fresh study until the last one exits."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    storage = args.postgres or str(folder / f"{name}.db")
    cpus = sorted(os.sched_getaffinity(0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    start = time.monotonic()
    procs = []
    for index in range(workers):
        share = set(cpus[index::workers]) if len(cpus) >= workers else None
        pin = (lambda s=share: os.sched_setaffinity(0, s)) if share else None
        cmd = [AUTOTUNE, "tune", model, "--global-batch", str(args.global_batch),
               "--trials", str(args.trials), "--repeats", "0", "--steps", "1", "--warmup", "0",
               "--device", "cpu", "--storage", storage, "--study", name, "--json",
               "--out-dir", str(folder)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      env=env, cwd=folder, preexec_fn=pin))  # fmt: skip
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise SystemExit(f"a worker failed: exit codes {codes}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL (default: sqlite files)")
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="bench-shared-") as tmp:
        for repeat in range(args.repeats):
            for workers in (1, 2) if repeat % 2 == 0 else (2, 1):
                times[workers].append(run_study(model, args, workers, Path(tmp)))
    print(f"model {Path(model).name}, global batch {args.global_batch}, {args.trials} trials, "
          f"{args.repeats} interleaved repeats, {len(os.sched_getaffinity(0))} CPUs")  # fmt: skip
    print("| workers | median s | min s | max s |")
    print("|---|---|---|---|")
    for workers, values in times.items():
        print(
            f"| {workers} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |"
        )
    ratios = sorted(a / b for a, b in zip(times[1], times[2], strict=True))
    print(f"one worker / two workers, per repeat: median {statistics.median(ratios):.2f}x "
          f"[{ratios[0]:.2f}, {ratios[-1]:.2f}]")  # fmt: skip


if __name__ == "__main__":
    main()
