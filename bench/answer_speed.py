"""Small commands that answer at once: whole-process wall and CPU time of `autotune suggest`
(goal <= 0.5 s) and `autotune estimate --hf-config` on a 7B config (goal <= 10 s).

Usage: OMP_NUM_THREADS=1 python bench/answer_speed.py [--repeats 7] [--before /path/to/old/tree]

Every repeat runs each case once per source tree, the order alternating, so load on a shared
machine hits both alike; with ``--before`` the same commands also run with PYTHONPATH set to
another checkout (the code before a change). Prints medians with [min, max].
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from _profiles import synthetic_profile  # noqa: E402

from autotune.records import write_record  # noqa: E402

AUTOTUNE = str(Path(sys.executable).parent / "autotune")


def _cases(folder: Path) -> dict[str, tuple[list[str], str | None]]:
    """Each case's command and its trace cache (``None``: a new empty one per run, cold)."""
    profile = write_record(folder / "profile.json", synthetic_profile(dataloader=0.5))
    config = REPO / "examples" / "configs" / "llama2_7b.json"
    estimate = [AUTOTUNE, "estimate", "--hf-config", str(config), "--seq-len", "4096", "-b", "1",
                "--json"]  # fmt: skip
    return {
        "suggest PROFILE --json": ([AUTOTUNE, "suggest", str(profile), "--json"], None),
        "estimate --hf-config llama2_7b --seq-len 4096 -b 1 --json (cold)": (estimate, None),
        "estimate ... (the same trace cached)": (estimate, str(folder / "warm-cache")),
    }


def _run(command: list[str], tree: Path, cache: str | None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one whole process."""
    with tempfile.TemporaryDirectory() as cold:
        return _timed(command, tree, cache or cold)


def _timed(command: list[str], tree: Path, cache: str) -> tuple[float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree),
           "AUTOTUNE_CACHE_DIR": cache}  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=tree)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--before", type=Path, default=None)
    args = parser.parse_args()
    trees = {"this tree": REPO} | ({"before": args.before.resolve()} if args.before else {})
    print(f"load average (1/5/15 min) at start: "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")  # fmt: skip
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(Path(tmp))
        for command, cache in cases.values():
            if cache is not None:
                _run(command, REPO, cache)  # fills the warm cache, untimed
        for repeat in range(args.repeats):
            names = list(trees) if repeat % 2 == 0 else list(trees)[::-1]
            for case, (command, cache) in cases.items():
                for name in names:
                    times.setdefault((case, name), []).append(_run(command, trees[name], cache))
    print(f"load average at end: {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"\n| command | tree | wall s, median [min, max] of {args.repeats} | CPU s, median |")
    print("|---|---|---|---|")
    for (case, name), values in times.items():
        walls, cpus = [v[0] for v in values], [v[1] for v in values]
        print(f"| `autotune {case}` | {name} | {_spread(walls)} | {statistics.median(cpus):.3f} |")


if __name__ == "__main__":
    main()
