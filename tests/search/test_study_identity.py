"""A study knows what it measured: a resume with a changed model file, package version or
device is refused with one line naming the change (a real `autotune tune`, resumed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _models import TINY_MLP_FILE

from autotune.records import AutotuneError
from autotune.search import open_study
from autotune.search._identity import IDENTITY_KEY, check_identity

MODEL = TINY_MLP_FILE
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
FIRST = {"model_sha256": "a" * 64, "torch": "2.13.0", "device_name": "cpu: X", "device_count": "2"}


def test_a_new_study_records_what_it_measures_and_a_changed_one_is_refused(
    tmp_path: Path,
) -> None:
    study = open_study(str(tmp_path / "s.db"), "s")
    check_identity(study, FIRST, "s")
    again = open_study(str(tmp_path / "s.db"), "s")  # read back from the storage
    assert again.user_attrs[IDENTITY_KEY] == FIRST
    check_identity(again, FIRST, "s")  # the same: resumed
    changed = {**FIRST, "model_sha256": "b" * 64, "device_count": "1"}
    with pytest.raises(AutotuneError) as err:
        check_identity(again, changed, "s")
    assert str(err.value) == (
        "--study s: its trials measured something else (the model file's content "
        "aaaaaaaaaaaa -> bbbbbbbbbbbb; the device count 2 -> 1); resuming would mix their "
        "measurements: give a new --study name (or another --storage)"
    )


@pytest.mark.slow
def test_a_resumed_tune_with_a_changed_model_file_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    (tmp_path / "out").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [AUTOTUNE, "tune", str(model), "--global-batch", "2", "--trials", "1", "--repeats",
           "0", "--steps", "1", "--warmup", "0", "--device", "cpu", "--storage",
           str(tmp_path / "study.db"), "--out-dir", str(tmp_path / "out"), "--trial-timeout",
           "120", "--json"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    model.write_text(MODEL.replace("nn.Linear(8, 8)", "nn.Linear(8, 16), nn.Linear(16, 8)"))
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 2
    assert second.stdout == ""
    # One line says why (a progress line of the command may come before it).
    lines = [x for x in second.stderr.splitlines() if x.startswith("autotune: ")]
    assert len(lines) == 1 and second.stderr.strip().endswith(lines[0]), second.stderr
    assert lines[0].startswith("autotune: --study model-g2-n1: its trials measured something "
                               "else (the model file's content ")  # fmt: skip
    assert "give a new --study name" in lines[0]
    import hashlib

    import optuna

    study = optuna.load_study(
        study_name="model-g2-n1", storage=f"sqlite:///{tmp_path / 'study.db'}"
    )
    # The refused run changed nothing: the study still names the model its trials measured.
    assert (
        study.user_attrs[IDENTITY_KEY]["model_sha256"] == hashlib.sha256(MODEL.encode()).hexdigest()
    )
