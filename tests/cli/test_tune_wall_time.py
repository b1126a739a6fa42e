"""`autotune tune` ends with where its wall time went (profile, start-up, trials, comparison),
the same breakdown kept in the record it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _profiles import synthetic_profile
from _search import FakePool
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import write_record
from autotune.search import TuneRecord

PHASES = ("profile_s", "startup_s", "trials_s", "comparison_s", "other_s")


def test_tune_prints_and_keeps_its_wall_time_breakdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("autotune.api._tune.PoolRunner", FakePool)
    model = tmp_path / "model.py"
    model.write_text("# never imported: the fake runner does not build it\n")
    profile = write_record(tmp_path / "p.json", synthetic_profile(device="cpu"))
    args = ["tune", str(model), "--global-batch", "8", "--profile", str(profile),
            "--device", "cpu", "--device-memory", "64GiB", "--trials", "3",
            "--storage", str(tmp_path / "s.db"), "--out-dir", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = TuneRecord.model_validate(json.loads((tmp_path / "autotune-tune.json").read_text()))
    wall = record.wall_time
    assert wall is not None
    phases = [getattr(wall, name) for name in PHASES]
    # Every phase measured on this road, none negative, and together they are the total.
    assert all(value is not None and value >= 0 for value in phases)
    assert sum(phases) == pytest.approx(wall.total_s, rel=1e-9, abs=1e-9)
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"wall time: {wall.describe()}"
    for label in ("profile", "start-up", "trials", "comparison", "other"):
        assert f" {label} " in last


def test_an_older_record_without_a_breakdown_still_reads(tmp_path: Path) -> None:
    record = TuneRecord(model_file="m.py", study="s", storage="sqlite:///s.db", global_batch=8,
                        nproc_per_node=1, device_memory=None, objective="samples_per_s", trials=[])  # fmt: skip
    old = record.model_dump(mode="json")
    del old["wall_time"]
    assert TuneRecord.model_validate(old).wall_time is None
