"""Wall time of ``autotune --help`` (goal <= 0.5 s) and of a whole ``autotune profile`` per example.

OMP_NUM_THREADS=1 .venv/bin/python bench/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AUTOTUNE = Path(sys.executable).parent / "autotune"
# (example, batch size): the defaults otherwise (20 steps, 3 warm-up).
PROFILES = [("tiny_llama.py", 4), ("mlp_dataloader.py", 32), ("slow_input.py", 16)]


def wall(args: list[str]) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, env=env, cwd=REPO)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    helps = [wall([str(AUTOTUNE), "--help"]) for _ in range(args.repeats)]
    print(
        f"autotune --help: median {statistics.median(helps):.3f} s "
        f"(min {min(helps):.3f}, max {max(helps):.3f}, {args.repeats} runs; goal <= 0.5 s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for example, batch in PROFILES:
            out = Path(tmp) / "p.json"
            cmd = [
                str(AUTOTUNE),
                "profile",
                f"examples/{example}",
                "-b",
                str(batch),
                "--out",
                str(out),
            ]
            seconds = wall(cmd)
            print(f"autotune profile examples/{example} -b {batch} (defaults): {seconds:.1f} s")


if __name__ == "__main__":
    main()
