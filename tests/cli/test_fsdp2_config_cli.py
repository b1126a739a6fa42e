"""`autotune config --plan engine=fsdp2,...`: the Accelerate config file accelerate reads, the code, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()


def test_the_written_file_is_read_by_accelerate(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    out = tmp_path / "fsdp2.yaml"
    result = runner.invoke(app, ["config", "--plan", "engine=fsdp2,stage=2,precision=bf16",
                                 "--nproc-per-node", "4", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    loaded = load_config_from_file(str(out))
    assert loaded.distributed_type == "FSDP" and loaded.num_processes == 4
    assert loaded.fsdp_config["fsdp_version"] == 2
    assert loaded.fsdp_config["fsdp_reshard_after_forward"] is False
    assert "fully_shard(block, reshard_after_forward=False, mp_policy=mp)" in result.stdout
    assert "TrainingArguments" in result.stdout


def test_json_carries_every_form() -> None:
    result = runner.invoke(app, ["config", "--plan", "engine=fsdp2,stage=3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) >= {"code", "accelerate_config", "accelerate_code", "hf_trainer", "notes"}
    assert out["hf_trainer"]["fsdp_config"]["version"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plan", "engine=fsdp2,stage=1"], "--plan: 'engine=fsdp2,stage=1'"),
        (["--plan", "engine=fsdp2,stage=3", "--hf-auto"], "--hf-auto: a DeepSpeed option"),
        (["--plan", "engine=fsdp2,stage=3", "--nvme-path", "/x"], "--nvme-path"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    out = tmp_path / "never.yaml"
    result = runner.invoke(app, ["config", *args, "--out", str(out)])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
