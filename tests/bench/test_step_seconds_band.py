"""The interval beside every predicted step time (``STEP_SECONDS_BAND``) is what the kept GPT-2
small measurements say of this commit's predictions: their measured / predicted seconds, 10th
and 90th percentiles. A change of the time model that moves them fails here until the band (and
its docstring's figures) follow the measurements."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

from autotune import compose
from autotune.estimator import STEP_SECONDS_BAND
from autotune.records import LinkMeasure, Machine, ProfileRecord

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from step_time import make_plans  # noqa: E402


def _quantile(values: list[float], share: float) -> float:
    """The linear-interpolation quantile (numpy's default) of ``values``."""
    ordered = sorted(values)
    at = share * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def test_the_band_is_the_kept_124m_measurements_over_this_commits_predictions() -> None:
    kept = json.loads((BENCH / "data" / "step_time_124m.json").read_text())
    (entry,) = kept.values()
    record = ProfileRecord.model_validate_json(
        (BENCH / "data" / "step_time_124m.profile.json").read_text()
    )
    composition = compose.compose(record, machine=Machine(device="cpu", nproc_per_node=2))
    composition = composition.on_link(LinkMeasure.model_validate(entry["link"]))
    blocks = record.model.block_stack.count if record.model.block_stack else 1
    ratios = []
    grid = "engines=zero0,zero2,zero3,fsdp2-3 precision=fp32,bf16 ckpt=none,full ga=1,4"
    args = argparse.Namespace(plans=[], grid=grid, nproc_per_node=2, global_batch=8)
    for plan in make_plans(args, blocks):
        runs = entry["seconds"][plan.model_dump_json()]
        predicted = composition.estimate(plan).predicted_step_seconds
        assert predicted is not None, plan.describe()
        ratios.append(statistics.median(runs) / predicted)
    assert len(ratios) == 32
    low, high = STEP_SECONDS_BAND
    assert _quantile(ratios, 0.1) == pytest.approx(low, abs=0.03)
    assert _quantile(ratios, 0.9) == pytest.approx(high, abs=0.03)
