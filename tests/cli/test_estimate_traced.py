"""`autotune estimate --profile` alone traces the precisions the profile lacks from the model file
the profile ran, as `tune` and `estimate MODEL --profile` do, where that file is unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from autotune.cli import app
from autotune.runtime.profiler import profile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAN = "precision=bf16,mb=2,stage=2"


def _estimate(*args: str) -> dict:
    result = CliRunner().invoke(app, ["estimate", *args, "--plan", PLAN, "--nproc-per-node", "2",
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["plans"]
    return row


def test_a_profile_alone_traces_its_own_model_file_for_16_bit_plans(tmp_path: Path) -> None:
    model = tmp_path / "tiny_llama.py"
    shutil.copy(EXAMPLES / "tiny_llama.py", model)
    record = profile(model, batch_size=2, steps=1, warmup=1, device="cpu")
    saved = tmp_path / "profile.json"
    saved.write_text(record.model_dump_json())

    alone = _estimate("--profile", str(saved))
    with_model = _estimate(str(model), "--profile", str(saved))
    assert alone["source"] == with_model["source"] == "traced"
    assert alone["memory"] == with_model["memory"]

    model.write_text(model.read_text() + "\n# edited since the profile\n")
    edited = _estimate("--profile", str(saved))
    assert edited["source"] == "formula"  # a file that changed is not the one profiled
    assert edited["memory"]["activations"] != alone["memory"]["activations"]
