"""The start-up hook of script trials, in plain processes (no torch): how a script that raises or
never calls an entry point ends up in the trial's result file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autotune.records import Plan, write_record
from autotune.runtime.trial.script import HOOK_DIR, SPEC_ENV
from autotune.search import TrialSettings, WorkerSpec


def _run(tmp_path: Path, source: str) -> tuple[subprocess.CompletedProcess[str], dict | None]:
    script = tmp_path / "train.py"
    script.write_text(source, encoding="utf-8")
    result = tmp_path / "result.json"
    spec = WorkerSpec(settings=TrialSettings(model_file="x", device="cpu"), plan=Plan(),
                      result_path=str(result))  # fmt: skip
    write_record(tmp_path / "spec.json", spec)
    env = {**os.environ, "PYTHONPATH": HOOK_DIR, SPEC_ENV: str(tmp_path / "spec.json")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    return done, json.loads(result.read_text()) if result.exists() else None


def test_a_raising_script_leaves_its_own_line_as_the_error(tmp_path: Path) -> None:
    done, result = _run(
        tmp_path, "def step(i):\n    raise ValueError(f'bad step {i}')\n\nstep(3)\n"
    )
    assert done.returncode == 1
    assert "Traceback" in done.stderr  # the script's own traceback is still printed
    assert result is not None
    assert result["error"] == f"ValueError: bad step 3 ({tmp_path / 'train.py'}:2)"


def test_a_script_that_calls_no_entry_point_is_told_so(tmp_path: Path) -> None:
    done, result = _run(tmp_path, "print('a hand-written loop')\n")
    assert done.returncode == 0
    assert result is not None
    assert result["error"].startswith("autotune: the script called none of transformers.Trainer")


def test_without_the_spec_variable_the_hook_does_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nprint(sorted(m for m in sys.modules if m.startswith('autotune')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != SPEC_ENV} | {"PYTHONPATH": HOOK_DIR}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
