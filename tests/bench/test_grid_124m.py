"""bench/grid_124m.py builds the whole grid, refuses bad flags before any work, and picks the
best plan only among those whose measured peak fits."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import grid_124m  # noqa: E402
from step_time import make_plans  # noqa: E402
from zero_peaks import REPO  # noqa: E402

GIB = 2**30
ENGINES = [("deepspeed", 0), ("deepspeed", 1), ("deepspeed", 2), ("deepspeed", 3),
           ("fsdp2", 2), ("fsdp2", 3)]  # fmt: skip
SPLITS = [(4, 1), (2, 2), (1, 4)]
"""(mb, ga) with mb x ga x 2 ranks = global batch 8."""


def _plans(narrow: str | None, blocks: int) -> set[tuple[object, ...]]:
    args = argparse.Namespace(plans=[], grid=grid_124m.grid_spec(4, narrow), nproc_per_node=2,
                              global_batch=8)  # fmt: skip
    plans = make_plans(args, blocks)
    found: set[tuple[object, ...]] = {(p.engine, p.zero_stage, p.precision, p.checkpoint_blocks, p.micro_batch,
              p.grad_accum) for p in plans}  # fmt: skip
    assert len(found) == len(plans) and {p.world_size for p in plans} == {2}
    return found


@pytest.mark.parametrize(
    ("blocks", "depths"),
    [(12, (0, 6, 12)), (1, (0, 1))],  # one block: half of it is all of it, counted once
)
def test_the_whole_grid_at_two_ranks_and_global_batch_8(blocks: int, depths: tuple[int, ...]) -> None:  # fmt: skip
    expected = {
        (engine, stage, precision, ckpt, mb, ga)
        for (engine, stage), precision, ckpt, (mb, ga) in itertools.product(
            ENGINES, ("fp32", "bf16"), depths, SPLITS
        )
    }
    assert len(expected) == 6 * 2 * len(depths) * 3
    assert _plans(None, blocks) == expected


def test_a_narrowed_grid_keeps_the_other_axes_whole() -> None:
    assert _plans("engines=zero1 precision=bf16 ckpt=none", 12) == {
        ("deepspeed", 1, "bf16", 0, mb, ga) for mb, ga in SPLITS
    }
    assert len(_plans("engines=fsdp2-3 ga=2", 12)) == 2 * 3


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--budget", "3"], "--budget"),
        (["--global-batch", "7"], "--global-batch"),
        (["--grid", "mb=2"], "--grid"),
        (["--grid", "engines=zero9"], "--grid"),  # refused by prepare, before any profile
        (["--grid", "ga=3"], "--global-batch"),
        (["--rounds", "0"], "--rounds"),
        (["--nproc-per-node", "3"], "--global-batch"),
        (["--measurements", "/no/such/folder/m.json"], "--measurements"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    argv: list[str], flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    model = Path(__file__).resolve().parents[2] / "examples" / "tiny_llama.py"
    command = ["grid_124m.py", str(model), "--measurements", str(tmp_path / "m.json"), *argv]
    monkeypatch.setattr(sys, "argv", command)
    with pytest.raises(SystemExit) as stop:
        grid_124m.prepare(grid_124m._arguments())
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"autotune: {flag}"), err
    assert not list(tmp_path.iterdir())  # nothing profiled, nothing written


def _row(plan: str, seconds: tuple[float, ...], peak: float | None) -> grid_124m.Row:
    return grid_124m.Row(plan=plan, samples=8, seconds=seconds,
                         peak=None if peak is None else int(peak * GIB), predicted=GIB)  # fmt: skip


def test_the_best_fits_and_the_near_ones_are_counted() -> None:
    table = [
        _row("over", (1.0,), 3.5),  # fastest, but its measured peak is over the budget
        _row("unknown peak", (1.0,), None),  # not known to fit
        _row("best", (2.0, 1.9, 2.4), 2.9),  # median 2.0 s: 4 samples/s
        _row("near", (2.04,), 3.0),  # 3.92 samples/s: within 2 %
        _row("far", (2.1,), 1.0),  # 3.81: not
        _row("failed", (), None),
    ]
    top, near = grid_124m.best(table, 3 * GIB)
    assert top is not None and top.plan == "best" and top.rate == pytest.approx(4.0)
    assert [row.plan for row in near] == ["near"]
    assert table[0].fits(3 * GIB) is False and table[1].fits(3 * GIB) is None
    assert grid_124m.best(table[:2], 3 * GIB) == (None, [])


MB_SECONDS = {4: 1.0, 2: 2.0, 1: 3.0}
"""The fake trials' seconds per step by micro-batch: mb=4 the fastest, but over the budget."""
MB_PEAK_GIB = {4: 3.5, 2: 2.5, 1: 2.0}


class _FakePool:
    """Stands in for PoolRunner: each trial 'measures' MB_SECONDS and MB_PEAK_GIB; one that
    sweeps the link (the calibration) returns a kept link with the engines' costs."""

    runs: list[str] = []
    timings: set[tuple[int, int]] = set()

    def __init__(self, **_: object) -> None:
        pass

    def __enter__(self) -> _FakePool:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def warm_up(self, plans: object, settings: object) -> float:
        return 0.0

    def run(self, plan: Any, settings: Any) -> Any:
        from autotune.records import LinkMeasure, TrialResult
        from autotune.search._records import RunReport

        _FakePool.runs.append(plan.describe())
        _FakePool.timings.add((settings.warmup, settings.steps))
        kept = json.loads((REPO / "bench" / "data" / "step_time_124m.json").read_text())
        link = LinkMeasure.model_validate(next(iter(kept.values()))["link"])  # ZeRO-0's cost in
        result = TrialResult(completed_steps=2, step_time=MB_SECONDS[plan.micro_batch],
                             peak_memory_bytes=[int(MB_PEAK_GIB[plan.micro_batch] * GIB)],
                             link=link if settings.sweep_link else None)  # fmt: skip
        return RunReport(returncode=0, timed_out=False, result=result, duration_s=1.0)


def test_the_grid_measures_each_plan_once_keeps_it_and_picks_the_fastest_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole script on three plans, trials faked: the link calibrated once, each plan
    measured once and written to the file; a second run resumes from the file and runs
    nothing. (Before stop 59 the script failed at its first trial: step_time's ``--relink``.)"""
    import autotune.search

    monkeypatch.setattr(autotune.search, "PoolRunner", _FakePool)
    measurements = tmp_path / "m.json"
    argv = ["grid_124m.py", str(REPO / "examples" / "gpt2_small.py"), "--rounds", "1",
            "--profile", str(REPO / "bench" / "data" / "step_time_124m.profile.json"),
            "--measurements", str(measurements), "--grid", "engines=zero0 precision=bf16 ckpt=none"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    _FakePool.runs, _FakePool.timings = [], set()
    grid_124m.main()
    plans = [f"precision=bf16,{split}stage=0,nproc_per_node=2"
             for split in ("mb=4,", "mb=2,ga=2,", "mb=1,ga=4,")]  # fmt: skip
    assert _FakePool.runs == plans[:1] + plans  # the calibration, then each plan once
    assert _FakePool.timings == {(1, 2)}  # as the kept grid was timed, not step_time's default
    first = capsys.readouterr().out
    assert f"best of the grid: {plans[1]}, 4.00" in first  # 8 samples / 2.0 s; mb=4 is over
    entry = next(iter(json.loads(measurements.read_text()).values()))
    assert sorted(s[0] for s in entry["seconds"].values()) == [1.0, 2.0, 3.0]
    grid_124m.main()
    assert len(_FakePool.runs) == 4  # resumed: nothing run again
    assert f"best of the grid: {plans[1]}, 4.00" in capsys.readouterr().out
