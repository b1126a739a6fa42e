"""bench/step_time.py times a fresh file's trials in the settled steps (2 untimed, the median of
3 after them), records that in the file, keeps a kept file's own timing for every trial added to
it (a file that names none was timed at 1 and 2), and refuses a flag at odds with it before any
work. The trials are faked; what is checked is the settings each trial is launched with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _search import FakePool

from autotune.records import LinkMeasure, Plan, TrialResult
from autotune.search import TrialSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_time  # noqa: E402
from zero_peaks import REPO  # noqa: E402

MODEL = REPO / "examples" / "tiny_gpt.py"
PROFILE = REPO / "bench" / "data" / "step_time_tiny_gpt.profile.json"
KEPT = REPO / "bench" / "data" / "step_time_tiny_gpt.json"
PLAN = "stage=0,precision=bf16"


class _FakePool(FakePool):
    """Each trial 'measures' 0.1 s a step; the one that sweeps the link (the calibration)
    returns tiny GPT's kept link with its engines' costs."""

    launched: list[tuple[int, int]] = []

    @staticmethod
    def _ok(plan: Plan, settings: TrialSettings) -> TrialResult:
        _FakePool.launched.append((settings.warmup, settings.steps))
        link = LinkMeasure.model_validate(next(iter(json.loads(KEPT.read_text()).values()))["link"])
        return TrialResult(completed_steps=settings.warmup + settings.steps, step_time=0.1,
                           link=link if settings.sweep_link else None)  # fmt: skip


def _main(monkeypatch: pytest.MonkeyPatch, measurements: Path, *flags: str) -> None:
    import autotune.search

    monkeypatch.setattr(autotune.search, "PoolRunner", _FakePool)
    monkeypatch.setattr(sys, "argv", ["step_time.py", str(MODEL), "--profile", str(PROFILE),
                                      "--measurements", str(measurements), "--plans", PLAN,
                                      "--rounds", "2", *flags])  # fmt: skip
    _FakePool.launched = []
    step_time.main()


def test_a_fresh_file_is_timed_in_the_settled_steps_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    measurements = tmp_path / "m.json"
    _main(monkeypatch, measurements)
    assert _FakePool.launched == [(2, 3)] * 3  # the calibration, then two rounds
    (entry,) = json.loads(measurements.read_text()).values()
    assert entry["timing"] == {"warmup": 2, "steps": 3}
    assert "each trial's seconds: the median of 3 steps after 2 untimed" in capsys.readouterr().out

    _main(monkeypatch, measurements, "--rounds", "3", "--steps", "3")  # its own timing, agreed
    assert _FakePool.launched == [(2, 3)]


def test_a_kept_file_keeps_its_own_timing_and_a_flag_at_odds_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a file kept before the timing was recorded: one round of PLAN, timed at 1 and 2
    (sha, entry), = json.loads(KEPT.read_text()).items()  # fmt: skip
    key = next(k for k in entry["seconds"] if json.loads(k)["precision"] == "bf16"
               and json.loads(k)["zero_stage"] == 0 and json.loads(k)["grad_accum"] == 1
               and json.loads(k)["checkpoint_blocks"] == 0)  # fmt: skip
    entry["seconds"] = {key: entry["seconds"][key][:1]}
    entry["peaks"] = {}
    measurements = tmp_path / "m.json"
    measurements.write_text(json.dumps({sha: entry}))
    _main(monkeypatch, measurements)
    assert _FakePool.launched == [(1, 2)]  # the second round, timed as the first
    assert "the median of 2 steps after 1 untimed" in capsys.readouterr().out
    before = measurements.read_text()
    assert json.loads(before)[sha]["timing"] == {"warmup": 1, "steps": 2}

    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "step_time.py"), str(MODEL), "--profile",
         str(PROFILE), "--measurements", str(measurements), "--plans", PLAN, "--warmup", "2"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"autotune: --warmup 2: {measurements} keeps this model's "
                                  "trials timed at 1 warm-up and 2 timed steps")  # fmt: skip
    assert "profiling" not in done.stdout and measurements.read_text() == before
