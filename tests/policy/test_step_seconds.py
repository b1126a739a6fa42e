"""Seconds per step and samples/s per device on every road a user reads: `estimate` prints them
where the profile measured the plan's precision, and each `suggest` step states them, the step
that changes the micro-batch included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _profiles import synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.estimator import STEP_SECONDS_BAND
from autotune.policy import suggest
from autotune.records import Machine

MiB = 2**20
runner = CliRunner()


def _profile():  # noqa: ANN202 - a ProfileRecord
    """A CPU profile at micro-batch 8: 1.0 s a step, of which the optimizer 1/15, the data 0."""
    return synthetic_profile(device="cpu", parameters=10_000_000, layers=4, batch_size=8,
                             activations_per_sample=20 * MiB, bf16_ratio=None, step=1.0,
                             heads=None)  # fmt: skip


def test_the_step_that_changes_the_micro_batch_states_its_time(tmp_path: Path) -> None:
    profile = _profile()
    time = profile.time
    record = suggest(profile, machine=Machine(device_memory=200 * MiB), global_batch=8)
    steps = {item.rule: item for item in record.suggestions}
    split = steps["keep_global_batch"]
    assert (split.plan.micro_batch, split.plan.grad_accum) == (4, 2)
    before = record.suggestions[record.suggestions.index(split) - 1].predicted
    after = split.predicted
    assert after.step_seconds_after is not None and before.step_seconds_after is not None
    # The profile's phases grow with the micro-batch (one profile: proportional) and the
    # optimizer steps once per step: two micro-batches of 4 cost what one of 8 did.
    assert after.step_seconds_after == pytest.approx(before.step_seconds_after, rel=1e-9)
    assert after.samples_per_s_per_device_after == pytest.approx(8 / after.step_seconds_after)
    # the checkpointed plan before it: the measured step plus one forward of the 4 blocks at
    # most (recompute), never less than the measured step
    assert time.step < before.step_seconds_after <= time.step + time.forward
    # and `suggest` says so, with the interval beside it
    shown = runner.invoke(app, ["suggest", str(_saved(tmp_path, profile)),
                                "--device-memory", "200MiB", "--global-batch", "8"],
                          env={"COLUMNS": "400"})  # fmt: skip
    assert shown.exit_code in (0, 1), shown.output
    low, high = (after.step_seconds_after * bound for bound in STEP_SECONDS_BAND)
    text = " ".join(shown.stdout.split())
    assert f"{after.step_seconds_after:.3g} s per step [{low:.3g}, {high:.3g}]" in text


def _saved(folder: Path, profile) -> Path:  # noqa: ANN001 - a ProfileRecord
    path = folder / "p.json"
    path.write_text(profile.model_dump_json())
    return path


def test_estimate_prints_seconds_and_samples_per_device(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_profile().model_dump_json())
    args = ["estimate", "--profile", str(path), "--plan", "mb=4,ga=2", "--plan", "mb=8"]
    shown = runner.invoke(app, args, env={"COLUMNS": "240"})
    assert shown.exit_code == 0, shown.output
    assert "s/step" in shown.stdout and "samples/s/dev" in shown.stdout
    data = runner.invoke(app, [*args, "--json"])
    plans = json.loads(data.stdout)["plans"]
    # proportional phases: mb=4 x 2 takes the measured 1.0 s of mb=8, 8 samples a second
    for est in plans:
        assert est["predicted_step_seconds"] == pytest.approx(1.0, rel=1e-9)
        # the interval beside it: the band the kept 124M measurements give (tests/bench)
        assert est["predicted_step_seconds_interval"] == pytest.approx(list(STEP_SECONDS_BAND))
    low, high = STEP_SECONDS_BAND
    assert f"s/step's interval: x{low:g} to x{high:g}" in " ".join(shown.stdout.split())
    rows = [line.split("│") for line in shown.stdout.splitlines() if "│" in line]
    assert any(cell.strip() == "8" for row in rows for cell in row)


def test_with_nothing_to_suggest_the_final_plan_still_states_its_time(tmp_path: Path) -> None:
    """The profiled plan on the profiled machine: its predicted seconds are the profile's own
    measured step, and `suggest` prints them although no rule applies."""
    profile = _profile()
    record = suggest(profile, machine=Machine(device_memory=100 * 2**30))
    assert record.suggestions == [] and record.final_plan == record.baseline
    final = record.final_predicted
    assert final is not None and final.fits_after
    assert final.step_seconds_after == pytest.approx(profile.time.step, rel=1e-9)
    assert final.samples_per_s_per_device_after == pytest.approx(profile.throughput.samples_per_s)
    shown = runner.invoke(app, ["suggest", str(_saved(tmp_path, profile)), "--device-memory",
                                "100GiB"], env={"COLUMNS": "400"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    low, high = (profile.time.step * bound for bound in STEP_SECONDS_BAND)
    assert "nothing to suggest" in text
    assert "predicted against the baseline: peak" in text
    assert f"{profile.time.step:.3g} s per step [{low:.3g}, {high:.3g}]" in text
