"""tune's floor under a single run's interval (``RUN_SPREAD``) is what the kept step-time
measurements say of the spread between runs of one plan: each run's |deviation| from its plan's
median, the median over every run of the four kept files it was taken from (tiny GPT's, kept
beside them, is held out). New measurements kept there that move
it fail here until the floor (and its docstring's figures) follow them. ``bench/run_spread.py``
prints the same figure; it is checked here on a file whose answer is worked by hand."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.search._records import RUN_SPREAD

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_floor_is_the_kept_runs_median_deviation_from_their_plans_median() -> None:
    deviations = []
    for name in ("124m", "bert", "llama_s512", "tiny_llama"):  # tiny GPT's is held out
        path = BENCH / "data" / f"step_time_{name}.json"
        (entry,) = json.loads(path.read_text()).values()
        for runs in entry["seconds"].values():
            assert len(runs) == 2  # two rounds a plan: the median is their mean
            spread = abs(runs[0] - runs[1]) / (runs[0] + runs[1])
            deviations += [spread, spread]
    assert len(deviations) == 256
    assert statistics.median(deviations) == pytest.approx(RUN_SPREAD, abs=0.001)


def test_the_script_prints_a_hand_worked_file(tmp_path: Path) -> None:
    # Plan a: 1.0 and 1.5 s, median 1.25: both runs 20 % off. Plan b: 2, 2 and 2.2 s, median 2:
    # 0, 0 and 10 %. Plan c ran once: no spread. Median of [0.2, 0.2, 0, 0, 0.1] = 10 %.
    data = {"sha": {"model": "m.py", "seconds": {"a": [1.0, 1.5], "b": [2.0, 2.0, 2.2], "c": [3]}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    # Held out: one plan at 1 and 3 s (median 2: 50 % each), printed alone, not pooled.
    held = tmp_path / "h.json"
    held.write_text(json.dumps({"sha": {"seconds": {"a": [1.0, 3.0]}}}))
    done = subprocess.run([sys.executable, str(BENCH / "run_spread.py"), str(path), "--held-out",
                           str(held)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("m.json") and "5 runs: median  10.0%" in lines[0]
    assert lines[1].startswith("all files above") and "5 runs: median  10.0%" in lines[1]
    assert lines[-1].startswith("held out: h.json") and "2 runs: median  50.0%" in lines[-1]

    path.write_text("[1]")
    done = subprocess.run([sys.executable, str(BENCH / "run_spread.py"), str(path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"autotune: {path}: not step-time measurements")
