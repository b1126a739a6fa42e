"""A real `autotune tune` stopped mid-trial (SIGINT, SIGTERM, SIGKILL): no trial process or
folder outlives it, the study says what happened (read back by Optuna itself), and the
next run resumes without losing or redoing a trial.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _processes import gone_within

pytestmark = pytest.mark.slow

MODEL = """
import os, time
import torch
from torch import nn

FLAG = os.environ.get("HANG_FLAG", "")


def build_model():
    # Trial workers only (the runner gives them RANK): tune's own profile is not held up.
    if FLAG and os.path.exists(FLAG) and "RANK" in os.environ:
        with open(FLAG + ".pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def build_batch(batch_size):
    return torch.randn(batch_size, 16), torch.randn(batch_size, 1)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
"""
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
STUDY = "interrupts"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the model file and its profile (taken once for every run here)."""
    root = tmp_path_factory.mktemp("interrupts")
    (root / "model.py").write_text(MODEL)
    done = subprocess.run([AUTOTUNE, "profile", str(root / "model.py"), "-b", "2", "--steps", "1",
                           "--warmup", "1", "--device", "cpu", "--out", str(root / "profile.json")],
                          capture_output=True, text=True, env=_env(root, None), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return root


def _env(root: Path, flag: Path | None) -> dict[str, str]:
    tmp = root / "tmp"  # trial folders go here (tempfile honours TMPDIR)
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
            "HANG_FLAG": str(flag) if flag else ""}  # fmt: skip


def _start(root: Path, run: Path, flag: Path | None) -> subprocess.Popen[str]:
    run.mkdir(exist_ok=True)
    cmd = [AUTOTUNE, "tune", str(root / "model.py"), "--global-batch", "4", "--trials", "2",
           "--repeats", "1", "--steps", "1", "--warmup", "0", "--device", "cpu",
           "--profile", str(root / "profile.json"), "--storage", str(run / "study.db"),
           "--study", STUDY, "--out-dir", str(run), "--trial-timeout", "120", "--json"]  # fmt: skip
    # SIGINT at its default: a test run started in the background by a shell without job
    # control inherits SIGINT ignored, and tune would then never see the interrupt.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(root, flag), preexec_fn=_default_sigint)  # fmt: skip


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _hung_worker(flag: Path, proc: subprocess.Popen[str]) -> int:
    """The pid of the trial worker once it hangs (it wrote its pid), asserting it is alive."""
    marker = Path(f"{flag}.pid")
    deadline = time.monotonic() + 240
    while not (marker.exists() and marker.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the trial never started"
        time.sleep(0.1)
    pid = int(marker.read_text())
    assert psutil.pid_exists(pid)
    return pid


def _trial_folders(root: Path) -> list[Path]:
    """Folders of per-trial launches (``trial-*``) and of pooled worker groups (``group-*``)."""
    return sorted(p for p in (root / "tmp").iterdir() if p.name.startswith(("trial-", "group-")))


def _trials(run: Path) -> list[object]:
    import optuna

    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{run / 'study.db'}").get_trials()


def _interrupt(root: Path, run: Path, flag: Path, signum: int) -> tuple[int, str, int]:
    """Run tune until its trial hangs, send ``signum``; the exit code, stderr and the worker."""
    flag.write_text("hang")
    Path(f"{flag}.pid").unlink(missing_ok=True)
    proc = _start(root, run, flag)
    worker = _hung_worker(flag, proc)
    try:
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if not gone_within(worker, 2.0):
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the trial worker outlived tune")
    return proc.returncode, err, worker


def _finish(root: Path, run: Path) -> dict[str, object]:
    proc = _start(root, run, None)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    record: dict[str, object] = json.loads(out)
    return record


def _measured_plans(run: Path) -> list[str]:
    return [json.dumps(t.user_attrs["plan"], sort_keys=True)  # type: ignore[attr-defined]
            for t in _trials(run) if t.user_attrs.get("outcome")]  # type: ignore[attr-defined]  # fmt: skip


def test_sigint_and_sigterm_give_the_trial_back_and_the_study_resumes(setup: Path) -> None:
    run, flag = setup / "signals", setup / "hang.flag"
    for signum, code, line in ((signal.SIGINT, 130, "autotune: interrupted"),
                               (signal.SIGTERM, 143, "autotune: terminated by SIGTERM")):  # fmt: skip
        returncode, err, _ = _interrupt(setup, run, flag, signum)
        assert returncode == code, err[-3000:]
        assert err.strip().splitlines()[-1] == line
        assert _trial_folders(setup) == [], "the interrupted trial's folder was left behind"
        trials = _trials(run)
        given_back = [t for t in trials if t.state.name == "FAIL"]  # type: ignore[attr-defined]
        assert given_back and all("queued again" in t.user_attrs["reason"] for t in given_back)  # type: ignore[attr-defined]
        assert not [t for t in trials if t.state.name == "RUNNING"]  # type: ignore[attr-defined]
        last = given_back[-1]
        queued = [t for t in trials if t.state.name == "WAITING"]  # type: ignore[attr-defined]
        assert any(t.user_attrs["plan"] == last.user_attrs["plan"] for t in queued)  # type: ignore[attr-defined]
    flag.unlink()
    record = _finish(setup, run)
    plans = _measured_plans(run)
    assert len(plans) == 2 and len(set(plans)) == 2, "a trial was lost or measured twice"
    interrupted = {json.dumps(t.user_attrs["plan"], sort_keys=True) for t in _trials(run)  # type: ignore[attr-defined]
                   if t.state.name == "FAIL"}  # type: ignore[attr-defined]  # fmt: skip
    assert interrupted <= set(plans), "an interrupted trial's plan was never measured"
    assert record["recommendation"] is not None
    assert _trial_folders(setup) == []


def test_sigkill_of_tune_leaves_no_worker_and_the_next_run_sweeps_and_resumes(setup: Path) -> None:
    run, flag = setup / "sigkill", setup / "hang9.flag"
    flag.write_text("hang")
    proc = _start(setup, run, flag)
    worker = _hung_worker(flag, proc)
    os.kill(proc.pid, signal.SIGKILL)  # tune alone: the worker is in a session of its own
    proc.communicate(timeout=60)
    assert gone_within(worker, 2.0), "the trial worker outlived a SIGKILLed tune"
    assert [t.state.name for t in _trials(run)].count("RUNNING") == 1  # type: ignore[attr-defined]
    assert len(_trial_folders(setup)) == 1  # nothing can clean up after SIGKILL ...
    flag.unlink()
    record = _finish(setup, run)
    assert _trial_folders(setup) == []  # ... so the next run sweeps it
    plans = _measured_plans(run)
    assert len(plans) == 2 and len(set(plans)) == 2
    stale = [t for t in _trials(run) if t.state.name == "FAIL"]  # type: ignore[attr-defined]
    assert len(stale) == 1 and "killed process" in stale[0].user_attrs["reason"]  # type: ignore[attr-defined]
    assert json.dumps(stale[0].user_attrs["plan"], sort_keys=True) in plans  # type: ignore[attr-defined]
    assert any("left running by a killed process" in note for note in record["notes"])  # type: ignore[union-attr]
