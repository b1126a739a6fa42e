"""`autotune config`: plan or recommendation in, a checked DeepSpeed config file out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.emit import code_changes_for
from autotune.records import Recommendation, parse_plan, write_record

runner = CliRunner()


def test_plan_to_file_with_a_summary_and_code_changes(tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    result = runner.invoke(app, ["config", "--plan", "stage=2,mb=4,ga=2,ckpt=3", "--nproc-per-node", "4",
                                 "--out", str(out), "--framework", "torch"])  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())
    assert config["train_batch_size"] == 32 and config["zero_optimization"]["stage"] == 2
    assert "activation checkpointing of the first 3 blocks" in result.stdout
    assert "[:3]" in result.stdout


def test_recommendation_file_and_json_output(tmp_path: Path) -> None:
    plan = parse_plan("stage=3,mb=2,precision=bf16,nproc_per_node=2")
    source = write_record(tmp_path / "rec.json", Recommendation(
        source="tune", plan=plan, code_changes=code_changes_for(plan)))  # fmt: skip
    result = runner.invoke(app, ["config", str(source), "--json"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["train_batch_size"] == 4 and config["bf16"]["enabled"] is True


def test_tune_record_holding_a_recommendation(tmp_path: Path) -> None:
    rec = Recommendation(source="tune", plan=parse_plan("stage=1,mb=3"))
    path = tmp_path / "tune.json"
    path.write_text(
        json.dumps({"model_file": "m.py", "recommendation": rec.model_dump(mode="json")})
    )
    result = runner.invoke(app, ["config", str(path), "--hf-auto"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["train_micro_batch_size_per_gpu"] == "auto"


def test_base_is_merged_and_a_conflict_is_one_line(tmp_path: Path) -> None:
    base = tmp_path / "mine.json"
    base.write_text(json.dumps({"steps_per_print": 7, "zero_optimization": {"stage": 3}}))
    out = tmp_path / "ds.json"
    ok = runner.invoke(app, ["config", "--plan", "stage=3", "--base", str(base), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["steps_per_print"] == 7
    out.write_text("earlier")
    bad = runner.invoke(
        app, ["config", "--plan", "stage=2", "--base", str(base), "--out", str(out)]
    )
    assert bad.exit_code == 2
    assert "zero_optimization.stage = 3 conflicts with the plan" in bad.output
    assert "Traceback" not in bad.output
    assert out.read_text() == "earlier"  # nothing written over the old file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "exactly one"),
        (["--plan", "stage=9"], "--plan"),
        (["--plan", "stage=2", "--framework", "jax"], "--framework"),
        (["missing.json"], "missing.json: no such recommendation file"),
        (["--plan", "stage=3,offload_param=nvme"], "nvme_path"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["config", *args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_bad_base_and_bad_recommendation_files(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text("[1, 2]")
    result = runner.invoke(app, ["config", "--plan", "stage=1", "--base", str(base)])
    assert result.exit_code == 2 and "must be a JSON object" in result.output
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"source": "tune", "plan": {"zero_stage": 7}}))
    result = runner.invoke(app, ["config", str(rec)])
    assert result.exit_code == 2 and "field plan.zero_stage" in result.output
