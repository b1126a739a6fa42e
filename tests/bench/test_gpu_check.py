"""The GPU check (bench/gpu_check.py) runs end to end on the CPU, and stops cleanly at its limit."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))

import _gpu_check_steps as steps  # noqa: E402
import gpu_check  # noqa: E402


def _check(
    tmp_path: Path, *args: str, timeout: float = 900
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The smoke run started outside the repository with a relative ``--out rel/R.md``: what
    it writes (its commands run in the repository) lands under the caller's ``rel/``. Every
    process it starts inherits ``MARK`` set to ``tmp_path``, so :func:`_left` finds them."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", "rel/R.md", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=elsewhere,
                          env={**os.environ, MARK: str(tmp_path)})  # fmt: skip
    return done, elsewhere / "rel" / "R.md"


MARK = "GPU_CHECK_TEST_RUN"


def _marked(tmp_path: Path) -> list[psutil.Process]:
    """The live processes one ``_check(tmp_path, ...)`` started: those whose environment
    carries its mark, whatever their session (another check running on the machine at the
    same time has another mark)."""
    return [process for process in psutil.process_iter(["cmdline", "environ", "status"])
            if (process.info["environ"] or {}).get(MARK) == str(tmp_path)
            and process.info["status"] != psutil.STATUS_ZOMBIE]  # fmt: skip


def _left(tmp_path: Path) -> list[list[str]]:
    """The command lines of :func:`_marked`'s processes, killed once read (a failing test
    leaves nothing running)."""
    left = _marked(tmp_path)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return [process.info["cmdline"] for process in left]


def _table(markdown: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header starts with ``header``, as cells."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    assert all(len(row) == len(rows[0]) for row in rows), "ragged table"
    return rows[2:]


@pytest.mark.slow
def test_smoke_run_measures_every_plan_and_tunes(tmp_path: Path) -> None:
    done, out = _check(tmp_path, "--time-limit", "900")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "pytest -m gpu: " in done.stdout and "gpu-check: complete" in done.stdout
    markdown = out.read_text()
    figures = json.loads(out.with_suffix(".json").read_text())
    work = out.parent / "gpu-check-work"
    # Every plan measured, and predicted both ways; the table prints the records' own peaks.
    plans = _table(markdown, "plan |")
    assert len(plans) == 4 and set(figures["measured"]) == set(figures["traced"]) == set(
        figures["profiled"]
    )
    for ckpt in (0, 2):
        record = json.loads((work / f"profile-mb2-ckpt{ckpt}.json").read_text())
        assert figures["measured"][f"amp_bf16-mb2-ckpt{ckpt}"]["peak"] == record["memory"]["peak"]
        assert figures["measured"][f"amp_bf16-mb2-ckpt{ckpt}"]["mfu"] == record["compute"]["mfu"]
    for key in ("bf16-mb2-ckpt0", "bf16-mb2-ckpt2"):
        assert (
            figures["measured"][key]["how"] == "trial worker"
            and figures["measured"][key]["peak"] > 0
        )
    # The tune's trials are the study's own, read back by Optuna.
    import optuna

    study = optuna.load_study(study_name="gpu-check", storage=f"sqlite:///{work / 'tune.db'}")
    finished = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    rows = _table(markdown, "# | role")
    assert len(finished) == 2 == sum(1 for row in rows if row[4] == "ok")
    assert "Largest micro-batch that fits: 2" in markdown
    assert figures["tune"]["recommendation"] is not None and not figures["errors"]
    # The sharded step: bench/zero_peaks.py's table with its reference and under-prediction line.
    assert "## Sharded per-rank peaks" in markdown and "under-prediction: " in markdown
    assert out.with_suffix(".json").is_file() and not (REPO / "rel").exists()


@pytest.mark.slow
def test_a_short_time_limit_stops_the_check_with_what_it_has(tmp_path: Path) -> None:
    done, out = _check(tmp_path, "--time-limit", "30", timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr[-3000:]
    markdown = out.read_text()
    assert "stopped at the time limit" in markdown and "## Not run, or failed" in markdown
    assert "## 1. `pytest -m gpu`" in markdown  # what ran before the limit is kept
    assert "autotune tune: not run" in markdown
    assert _left(tmp_path) == []


def test_sigterm_stops_the_check_with_every_process_it_started(tmp_path: Path) -> None:
    """The steps' children run in their own sessions (so a deadline can stop each with its
    group): a SIGTERM to the check alone reaches none of them, and they ran on after it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    check = subprocess.Popen([sys.executable, str(SCRIPT), "--smoke", "--only", "sharded",
                              "--out", "rel/R.md"], cwd=elsewhere, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, MARK: str(tmp_path)})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(_marked(tmp_path)) < 2:  # the check and its step's child
            assert check.poll() is None and time.monotonic() < deadline, "the step never started"
            time.sleep(0.2)
        time.sleep(2)  # the step's own children start
        check.send_signal(signal.SIGTERM)
        out, _ = check.communicate(timeout=60)
    finally:
        check.kill()
        left = _left(tmp_path)
    assert check.returncode == 143, out
    assert "gpu-check: stopped by SIGTERM" in out
    markdown = (elsewhere / "rel" / "R.md").read_text()
    assert "stopped by SIGTERM" in markdown and "## Not run, or failed" in markdown
    assert left == []


@pytest.mark.parametrize("own_session", [False, True])
def test_a_child_past_the_deadline_is_stopped_with_everything_it_started(
    tmp_path: Path, own_session: bool
) -> None:
    """A grandchild in the child's group dies with it; one in its own session (as trial
    workers are) is found by the run's mark in its environment and killed."""
    run = steps.Run(config=gpu_check.SMOKE, work=tmp_path, repo=REPO, smoke=True,
                    deadline=time.monotonic() + 7)  # fmt: skip
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            f"start_new_session={own_session}); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)")  # fmt: skip
    env = {**os.environ, **run.child_env()}
    done = run.command("sleeper", [sys.executable, "-c", code], cap=60, env=env)
    assert done.returncode is None and done.seconds < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != "zombie":
        assert time.monotonic() < deadline, "the grandchild outlived the check's deadline"
        time.sleep(0.1)


def test_a_child_stopped_at_the_deadline_gets_sigint_even_when_the_check_ignores_it(
    tmp_path: Path,
) -> None:
    """Run in the background by a shell without job control, the check starts with SIGINT
    ignored, and a child inherits that: it would miss the SIGINT that lets autotune clean up,
    and die by the SIGKILL after it. The child here writes a file on KeyboardInterrupt."""
    run = steps.Run(config=gpu_check.SMOKE, work=tmp_path, repo=REPO, smoke=True,
                    deadline=time.monotonic() + 8)  # fmt: skip
    cleaned = tmp_path / "cleaned"
    code = ("import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
            f"    open({str(cleaned)!r}, 'w').write('SIGINT')")  # fmt: skip
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        done = run.command("sleeper", [sys.executable, "-c", code], cap=60, env=dict(os.environ))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done.returncode is None and cleaned.read_text() == "SIGINT"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--smoke", "--time-limit", "0"], "autotune: --time-limit: must be positive (got 0.0)"),
     (["--smoke", "--only", "tune,nope"], "autotune: --only: unknown step 'nope' (known: pytest,"),
     ([], "autotune: no CUDA GPU is visible")],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    import torch

    if not args and torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    out = tmp_path / "r.md"
    assert gpu_check.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err
    assert not out.exists() and not (tmp_path / "gpu-check-work").exists()


def test_the_check_leaves_ds_accelerator_to_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    gpu = steps.Run(config=gpu_check.GPU, work=REPO, repo=REPO, smoke=False, deadline=0.0)
    env = gpu.child_env()
    assert env["DS_ACCELERATOR"] == "cuda" and env["GPU_CHECK_INIT_DEVICE"] == "cuda"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
