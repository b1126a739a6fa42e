"""The pooled runner: a live worker measures what a fresh one measures; failures relaunch fresh;
no group outlives the process that started it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from _models import mlp_stack

from autotune.records import Plan
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import PoolRunner, SubprocessRunner, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._records import RunReport

ENV = {"OMP_NUM_THREADS": "1"}

# Builds like the MLP stack, but a batch of 3 raises: a trial that crashes in the worker.
CRASH_AT_3 = mlp_stack(blocks=2, hidden=32) + textwrap.dedent(
    """
    _build_batch = build_batch

    def build_batch(batch_size):
        if batch_size == 3:
            raise ValueError("no batches of 3")
        return _build_batch(batch_size)
    """
)


@pytest.fixture
def model(tmp_path: Path) -> str:
    path = tmp_path / "mlp.py"
    path.write_text(CRASH_AT_3)
    return str(path)


def _settings(model: str, **kw: object) -> TrialSettings:
    values: dict[str, object] = {"steps": 2, "warmup": 1, "device": "cpu", "timeout_s": 300, **kw}
    return TrialSettings(model_file=model, **values)  # type: ignore[arg-type]


def _ok(report: RunReport) -> bool:
    outcome = classify_outcome(
        report.returncode, report.timed_out, report.result, report.stderr_tail
    )
    return outcome == "ok"


def _peaks(report: RunReport) -> list[int]:
    assert _ok(report), report.stderr_tail[-2000:]
    assert report.result is not None
    return report.result.peak_memory_bytes


def _close(a: list[int], b: list[int], tolerance: float = 0.01) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance * y for x, y in zip(a, b, strict=True))


def test_reused_worker_measures_the_peak_a_fresh_one_does(model: str, tmp_path: Path) -> None:
    plans = [Plan(micro_batch=4), Plan(micro_batch=2, grad_accum=2, checkpoint_blocks=1)]
    fresh = SubprocessRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "fresh")
    expected = [_peaks(fresh.run(plan, _settings(model))) for plan in plans]
    with PoolRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "pool") as pool:
        # Each plan runs after the other one in the same process, then again.
        reports = [pool.run(plan, _settings(model)) for plan in plans + plans]
    assert [r.result.reused for r in reports if r.result] == [False, True, True, True]
    for report, want in zip(reports, expected + expected, strict=True):
        assert _close(_peaks(report), want), (report.result, want)
    fixed = [r.fixed_s for r in reports]
    assert all(f is not None and f >= 0 for f in fixed)


@pytest.mark.slow
def test_two_rank_worker_reused_after_zero3_measures_the_fresh_peak(
    model: str, tmp_path: Path
) -> None:
    # ZeRO-3 left its model on DeepSpeed's module-level stack and in a class-level cache:
    # every later trial in that process counted it. With checkpointed blocks the stack also
    # kept the blocks a recompute entered (their post-hooks never run). ZeRO-1/2 are not used
    # here: their live peak on two CPU ranks varies by one gradient partition from run to run.
    plans = [
        Plan(micro_batch=2, nproc_per_node=2, zero_stage=3, checkpoint_blocks=2),
        Plan(micro_batch=2, nproc_per_node=2, zero_stage=0),
    ]
    fresh = SubprocessRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "fresh")
    expected = [_peaks(fresh.run(plan, _settings(model))) for plan in plans]
    system_tmp = tmp_path / "system-tmp"  # the group's temporary directory (TMPDIR)
    system_tmp.mkdir()
    env = {**ENV, "TMPDIR": str(system_tmp)}
    with PoolRunner(entry_points=ENTRY_POINTS, env=env, workdir=tmp_path / "pool") as pool:
        reports = [pool.run(plan, _settings(model)) for plan in plans + plans]
    assert all(r.result is not None and r.result.reused for r in reports[1:])
    for report, want in zip(reports, expected + expected, strict=True):
        assert _close(_peaks(report), want), (report.result, want)
    # torchrun's log folder went with the group's own: none left in the temporary directory
    assert not list(system_tmp.glob("torchelastic_*")), list(system_tmp.iterdir())


def test_a_failed_trial_relaunches_a_fresh_worker(model: str, tmp_path: Path) -> None:
    with PoolRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "pool") as pool:
        first = pool.run(Plan(micro_batch=4), _settings(model))
        pid = pool.live_groups()[(1, "cpu")]
        crashed = pool.run(Plan(micro_batch=3), _settings(model))
        assert (1, "cpu") not in pool.live_groups()
        after = pool.run(Plan(micro_batch=4), _settings(model))
        assert pool.live_groups()[(1, "cpu")] != pid
    outcome = classify_outcome(
        crashed.returncode, crashed.timed_out, crashed.result, crashed.stderr_tail
    )
    assert outcome == "crash" and "no batches of 3" in crashed.stderr_tail
    assert _ok(first) and _ok(after)
    assert after.result is not None and not after.result.reused
    assert _gone(pid)


ORPHAN = textwrap.dedent(
    """
    import os, sys
    from autotune.records import Plan
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import PoolRunner, TrialSettings

    pool = PoolRunner(entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=sys.argv[2])
    pool.run(Plan(micro_batch=2), TrialSettings(model_file=sys.argv[1], steps=1, warmup=0,
                                                device="cpu", timeout_s=120))
    print(pool.live_groups()[(1, "cpu")], flush=True)
    os._exit(0)  # no close(): the group must notice by itself
    """
)


def test_a_group_exits_when_its_parent_dies(model: str, tmp_path: Path) -> None:
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    done = subprocess.run([sys.executable, str(script), model, str(tmp_path / "pool")],
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    pid = int(done.stdout.split()[-1])
    assert _gone(pid, seconds=20), "the worker group outlived its parent"


def _gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_steps_are_measured_until_the_median_is_known_or_a_cap(model: str, tmp_path: Path) -> None:
    import statistics

    settings = _settings(model, steps=3, interval_width=0.05, max_steps=8, max_measure_s=60)
    with PoolRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "pool") as pool:
        reports = [pool.run(Plan(micro_batch=4), settings) for _ in range(2)]
    for report in reports:
        assert _ok(report) and report.result is not None
        times = report.result.step_times
        assert 3 <= len(times) <= 8
        low, high = report.result.step_interval or (0.0, 0.0)
        assert low in times and high in times and low <= statistics.median(times) <= high
        # Stopped because the interval is within +-5 % of the median, or at the step cap.
        within = (high - low) / 2 <= 0.05 * statistics.median(times) and len(times) >= 5
        assert within or len(times) == 8
    # A fixed count without a width.
    with PoolRunner(entry_points=ENTRY_POINTS, env=ENV, workdir=tmp_path / "fixed") as pool:
        fixed = pool.run(Plan(micro_batch=4), _settings(model, steps=3))
    assert fixed.result is not None and len(fixed.result.step_times) == 3
