"""`autotune tune` from the command line: one-line errors, and a real end-to-end run (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py", "--global-batch", "4"], "missing.py: no such model file"),
        (
            ["{model}", "--global-batch", "3", "--nproc-per-node", "2"],
            "global_batch (--global-batch) 3 does not split over nproc_per_node (--nproc-per-node) 2",
        ),
        (
            ["{model}", "--global-batch", "4", "--out-dir", "{model}/runs"],
            "is not a directory",
        ),
        (["{model}", "--global-batch", "4", "--baseline", "mb=x"], "--baseline"),
        (["{model}", "--global-batch", "4", "--device-memory", "lots"], "--device-memory"),
        (
            ["{model}", "--global-batch", "4", "--interval", "1.5"],
            "interval_width (--interval): 1.5",
        ),
        (
            ["{model}", "--global-batch", "4", "--max-steps", "0"],
            "--max-steps: must be >= 1 (got 0)",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, examples_dir: Path,
                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    model = str(examples_dir / "mlp_dataloader.py")
    result = CliRunner().invoke(app, ["tune", *(a.format(model=model) for a in args)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_tune_end_to_end_writes_recommendation_and_ds_config(
    examples_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [
        str(Path(sys.executable).with_name("autotune")), "tune", str(examples_dir / "mlp_dataloader.py"),
        "--global-batch", "8", "--trials", "2", "--repeats", "1", "--steps", "1", "--warmup", "0",
        "--device", "cpu", "--out-dir", str(tmp_path), "--storage", str(tmp_path / "t.db"), "--json",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)  # stdout holds the record and nothing else
    measured = [t for t in record["trials"] if t["outcome"] is not None]
    assert len(measured) == 2
    # Start-up and steps apart on every measured trial, with the median's interval.
    for trial in measured:
        assert trial["fixed_s"] is not None and trial["steps_s"] is not None
        low, high = trial["step_interval"]
        assert low <= trial["step_time"] <= high and trial["steps_measured"] >= 1
    assert measured[1]["reused_worker"] is True
    assert record["trials"][0]["role"] in ("policy", "baseline")
    rec = json.loads((tmp_path / "recommendation.json").read_text())
    assert rec["source"] == "tune" and rec["plan"] == record["recommendation"]["plan"]
    config = json.loads((tmp_path / "ds_config.json").read_text())
    plan = rec["plan"]
    assert config["train_batch_size"] == 8
    assert config["train_micro_batch_size_per_gpu"] == plan["micro_batch"]
    # --finish starts no trial and reads the study's one final comparison back.
    (tmp_path / "recommendation.json").unlink()
    done = subprocess.run([*cmd, "--finish"], capture_output=True, text=True, env=env, timeout=400,
                          cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads(done.stdout)
    assert again["comparison"] == record["comparison"]
    assert any("read from the study" in note for note in again["notes"])
    assert [t["number"] for t in again["trials"]] == [t["number"] for t in record["trials"]]
    assert json.loads((tmp_path / "recommendation.json").read_text())["plan"] == rec["plan"]
