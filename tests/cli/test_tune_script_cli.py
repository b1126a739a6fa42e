"""``autotune tune -- COMMAND`` refuses a bad command or mapping before any launch: one line
``autotune: ...`` naming the flag or the command's part, exit status 2, nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "scripts" / "deepspeed_train.py")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--", "python", "missing_train.py"], "autotune: --: missing_train.py: no such script"),
        (["--", "make", "train"], "autotune: --: make: not a launch command autotune knows"),
        (["--arg-map", "micro=--batch-size", "--", "python", SCRIPT],
         "autotune: --arg-map micro=--batch-size: use KEY=--flag with KEY one of"),
        (["--nproc-per-node", "2", "--", "torchrun", "--nproc-per-node=4", SCRIPT],
         "autotune: --nproc-per-node 2: the command launches 4 per node"),
        (["--nproc-per-node", "2", "--engines", "deepspeed,fsdp2", "--", "python", SCRIPT],
         "autotune: --engines fsdp2: a script's trials inject DeepSpeed only"),
        (["--nnodes", "2", "--", "python", SCRIPT],
         "autotune: --nnodes 2: a script's trials run on this node only"),
    ],
)  # fmt: skip
def test_bad_script_input_is_one_line_and_exit_2(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["tune", "--global-batch", "8", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line)
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--", "make", "train"], "autotune: --: make: not a launch command autotune knows"),
        (["--", "python", "missing_train.py"], "autotune: --: missing_train.py: no such script"),
        (
            ["--arg-map", "x=--y", "--", "python", SCRIPT],
            "autotune: --arg-map x=--y: use KEY=--flag",
        ),
    ],
)
def test_profile_of_a_bad_command_is_one_line_and_exit_2(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["profile", "--batch-size", "2", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line)
    assert list(tmp_path.iterdir()) == []
