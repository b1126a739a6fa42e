"""bench/tune_replay.py: tune's search replayed on the 124M grids kept in bench/data, the grids'
own measurements standing in for the machine. The search measures the grid's best plan that
fits, found here from the grid file itself, on both CPUs' grids (issue 33)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import tune_replay  # noqa: E402

from autotune.records import Plan  # noqa: E402

DATA = tune_replay.REPO / "bench" / "data"
GIB = 2**30


def _best_that_fits(grid: Path, budget: int) -> Plan:
    """The plan with the fewest median seconds per step whose measured peak is within budget."""
    (entry,) = json.loads(grid.read_text()).values()
    fitting = [key for key, peaks in entry["peaks"].items() if peaks and max(peaks) <= budget]
    key = min((k for k in fitting if entry["seconds"].get(k)),
              key=lambda k: statistics.median(entry["seconds"][k]))  # fmt: skip
    return Plan.model_validate_json(key)


@pytest.mark.parametrize(
    ("grid", "profiles"),
    [("grid_124m_amx.json", "grid_124m_amx.tune-profiles.json"),
     ("grid_124m.json", "step_time_124m.tune-profiles.json")],
    ids=["intel-amx", "amd-epyc"],
)  # fmt: skip
def test_the_search_measures_the_grids_best_plan(grid: str, profiles: str) -> None:
    args = argparse.Namespace(
        grid=DATA / grid, model=str(tune_replay.MODEL), nproc_per_node=2, global_batch=8,
        budget_bytes=3 * GIB, trials=6, spread=0.055, profiles=DATA / profiles, engines=None,
    )  # fmt: skip
    best = _best_that_fits(args.grid, args.budget_bytes)
    loaded, record = tune_replay._load(args)
    for seed in range(3):
        tuned, ran = tune_replay.replay(args, loaded, record, seed)
        assert best in {loaded.truth(plan) for plan in ran}, (seed, best.describe())
        measured = [t for t in tuned.trials if t.outcome is not None and t.role != "unchanged"]
        assert len(measured) == args.trials
        assert tuned.recommendation is not None
