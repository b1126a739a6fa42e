"""Waits say what they wait for and end at a deadline: a real process holds the host lock,
and a real second `autotune tune` (stderr a pipe, not a terminal) says it waits on it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest
from _models import TINY_MLP_FILE
from _waiting import lines_until

from autotune.records import AutotuneError
from autotune.search._waits import take_flock

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from autotune.search._runner import device_units, host_lock
    with host_lock(device_units("cpu")):
        Path(sys.argv[1]).write_text("held")
        while not Path(sys.argv[2]).exists():
            time.sleep(0.02)
    """
)
MODEL = TINY_MLP_FILE
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def _hold(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """A real process holding this host's CPU lock (in ``TMPDIR``) until ``release`` exists."""
    held, release = tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held), str(release)], env=env)
    deadline = time.monotonic() + 60
    while not held.exists():
        assert holder.poll() is None, "the holder died"
        assert time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.02)
    return holder, release


def test_a_lock_wait_names_the_holder_then_ends_at_its_deadline(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(
        """
        import fcntl, sys, time
        handle = open(sys.argv[1], "a")
        fcntl.flock(handle, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(600)
        """), str(tmp_path / "x.lock")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        told: list[str] = []
        with (tmp_path / "x.lock").open("a") as handle, pytest.raises(AutotuneError) as err:
            take_flock(handle, tmp_path / "x.lock", deadline_s=3.5, what="a test holder",
                       tell=told.append)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert told == [f"waiting for the lock {tmp_path / 'x.lock'} held by pid {holder.pid} "
                    "(a test holder); gives up after 4 s"]  # fmt: skip
    message = str(err.value)
    assert "\n" not in message
    assert f"{tmp_path / 'x.lock'} held by pid {holder.pid} stayed held for 4 s" in message


@pytest.mark.slow
def test_a_second_tune_says_it_waits_on_the_host_lock(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "out").mkdir()
    tmp = tmp_path / "tmp"  # this test's host locks and trial folders
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    holder, release = _hold(tmp_path, env)
    cmd = [AUTOTUNE, "tune", str(tmp_path / "model.py"), "--global-batch", "2", "--trials", "1",
           "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
           "--storage", str(tmp_path / "study.db"), "--out-dir", str(tmp_path / "out"),
           "--trial-timeout", "120", "--json"]  # fmt: skip
    tune = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    try:
        lines = lines_until(tune, "waiting for the lock", 300)  # a pipe: no terminal
        assert f"held by pid {holder.pid}" in lines[-1], "".join(lines)
        assert lines[-1].startswith("autotune: waiting for the lock ")
        release.touch()
        out, err = tune.communicate(timeout=300)
        err = "".join(lines) + err
    finally:
        release.touch()
        holder.wait(timeout=60)
        if tune.poll() is None:
            tune.kill()
            tune.wait()
    assert tune.returncode == 0, err[-3000:]
    assert '"recommendation"' in out


HANGS_IN_RANKS = MODEL.replace(
    "def build_model():\n",
    "def build_model():\n    import os, time\n    if 'RANK' in os.environ:  # the trials' ranks only\n"
    "        time.sleep(600)\n",
)


@pytest.mark.slow
def test_a_model_that_hangs_in_the_ranks_ends_at_the_start_up_deadline(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(HANGS_IN_RANKS)
    (tmp_path / "out").mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [AUTOTUNE, "tune", str(tmp_path / "model.py"), "--global-batch", "4", "--trials", "4",
           "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
           "--storage", str(tmp_path / "study.db"), "--out-dir", str(tmp_path / "out"),
           "--trial-timeout", "15"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("autotune: a worker group of 1 rank(s) on cpu did not reach its first "
                           "step within --trial-timeout-s 15 s")  # fmt: skip
    # Nothing left running: no process started with a folder of this test's TMPDIR.
    assert [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp) in " ".join(
        p.info["cmdline"] or [])] == []  # fmt: skip


def test_a_trial_waiting_on_an_earlier_ones_plan_says_so_then_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another worker asked for trial 0 and never named its plan (it died in between): trial 1
    waits 3 heartbeats for it, says so once the wait is longer than the notice's threshold, and
    goes on at the deadline."""
    from autotune.search import _study, _waits

    monkeypatch.setattr(_waits, "NOTICE_AFTER_S", 0.5)
    study = _study.open_study(f"sqlite:///{tmp_path / 's.db'}", "s", heartbeat_s=1)
    with warnings.catch_warnings():  # Optuna expects heartbeats with optimize()
        warnings.simplefilter("ignore", UserWarning)
        study.ask()  # trial 0, running, no plan
    start = time.monotonic()
    _study.wait_for_earlier_plans(study, 1)
    waited = time.monotonic() - start
    assert waited >= 3.0, "it went on before the deadline"
    told = capsys.readouterr().err.splitlines()
    assert told == [
        "autotune: trial 1 waits up to 3 s for trial(s) 0 of other workers to name their plans, "
        "so that two workers do not run one plan"
    ]
