"""The README's usual loop runs as the README holds it, from an empty folder, on the tiny example.

The commands are read from README.md itself, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AUTOTUNE = Path(sys.executable).with_name("autotune")


def readme_loop() -> list[list[str]]:
    """The commands of the README's ``The usual loop:`` block, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split("The usual loop:", 1)[1]
    block = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_loop_is_autotunes_five_commands_in_order() -> None:
    loop = readme_loop()
    assert [words[:2] for words in loop] == [
        ["autotune", "profile"], ["autotune", "suggest"], ["autotune", "confirm"],
        ["autotune", "tune"], ["autotune", "report"],
    ]  # fmt: skip


@pytest.mark.slow
def test_the_readme_loop_runs_verbatim_from_an_empty_directory(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples" / "tiny_llama.py", tmp_path / "model.py")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for words in readme_loop():
        done = subprocess.run([str(AUTOTUNE), *words[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert done.returncode == 0, f"{shlex.join(words)}:\n{done.stderr[-3000:]}"
    made = {path.name for path in tmp_path.iterdir()}
    assert {"autotune-profile.json", "autotune-confirm.json", "autotune-tune.json",
            "ds_config.json", "recommendation.json", "report.html"} <= made  # fmt: skip
    # a model this small spends much of a micro-batch in its operators' own cost: the profile
    # timed a quarter of its batch after it, and every estimate from it splits each phase
    record = json.loads((tmp_path / "autotune-profile.json").read_text())
    first, second = record["config"]["batch_size"], record["second"]
    assert second["config"]["batch_size"] == first // 4
    assert 0 < second["time"]["step"] < record["time"]["step"]
    if record["environment"]["threads"] > 1:  # a rank on fewer cores is scaled by the probe
        assert record["time"]["one_thread_over_all"] > 0
    done = subprocess.run([str(AUTOTUNE), "estimate", "--profile", "autotune-profile.json",
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    fit = f"fixed + per-sample parts from batch {first} and {first // 4}"
    assert fit in done.stdout
