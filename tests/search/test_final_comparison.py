"""One final comparison per study: two workers sharing a study run it once between them,
reruns and ``finish=True`` read it back, and a worker still running trials holds it off.
The study is read back by Optuna itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import optuna
import pytest
from _search import run_tune

from autotune.records import Plan
from autotune.search import TrialResult, TrialSettings
from autotune.search._compare import compare
from autotune.search._final import ATTR, claim, comparison_key, final_comparison, write
from autotune.search._records import TrialRecord
from autotune.search._runner import FakeRunner
from autotune.search._tune import best_records

WORKER = textwrap.dedent(
    """
    import json, os, sys
    from autotune.records import Plan
    from autotune.search import TrialResult, TrialSettings
    from autotune.search import _compare
    from autotune.search._runner import FakeRunner

    # who runs the comparison is under test, not its length: four plans of six equal trials
    # re-run would pass its share of the search's time
    _compare.OVERHEAD_SHARE = 1.0
    sys.path.insert(0, os.environ["AUTOTUNE_TESTS"])
    from _search import run_tune

    storage = sys.argv[1]

    def behaviour(plan, settings):
        speed = 10.0 + plan.micro_batch - plan.checkpoint_blocks
        return TrialResult(completed_steps=2, samples_per_s=speed, peak_memory_bytes=[1])

    runner = FakeRunner(behaviour, delay_s=0.3)
    record = run_tune("m.py", global_batch=4, settings=TrialSettings(model_file="m.py", timeout_s=5),
                  runner=runner, blocks=1, baseline=Plan(micro_batch=1, grad_accum=4), trials=6,
                  storage=storage, repeats=2)
    mine = [t for t in record.trials if t.outcome is not None]
    print(json.dumps({"launches": len(runner.plans),
                      "comparison": record.comparison.model_dump(mode="json") if record.comparison else None,
                      "notes": record.notes}))
    """
)


def behaviour(plan: Plan, settings: TrialSettings) -> TrialResult:
    speed = 10.0 + plan.micro_batch - plan.checkpoint_blocks
    return TrialResult(completed_steps=2, samples_per_s=speed, peak_memory_bytes=[1])


def _search_launches(storage: Path, pid: int) -> int:
    trials = optuna.load_study(study_name="autotune", storage=f"sqlite:///{storage}").get_trials()
    return sum(1 for t in trials if t.user_attrs.get("pid") == pid and t.user_attrs.get("outcome"))


def test_two_workers_run_the_final_comparison_once(tmp_path: Path) -> None:
    # Six plans (micro-batch 1, 2, 4 x 0 or 1 checkpointed blocks), six trials: neither
    # worker can start a trial after the other has found the study complete.
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    storage = tmp_path / "shared.db"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "AUTOTUNE_TESTS": str(Path(__file__).parent.parent),
    }
    procs = [subprocess.Popen([sys.executable, str(script), str(storage)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    outputs = [proc.communicate(timeout=300) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    results = [json.loads(out) for out, _ in outputs]
    # Launches beyond a worker's own search trials are comparison runs.
    extra = [
        r["launches"] - _search_launches(storage, p.pid)
        for r, p in zip(results, procs, strict=True)
    ]
    ran = [i for i, n in enumerate(extra) if n > 0]
    assert len(ran) == 1, f"comparison runs per worker: {extra}"
    compared = results[ran[0]]["comparison"]
    assert compared is not None and extra[ran[0]] == sum(compared["reruns"])
    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{storage}")
    assert study.user_attrs[ATTR]["comparison"] == compared
    other = results[1 - ran[0]]
    # The other worker waited for the trials still running, then for the comparison the first
    # claimed, and read it: both end on one answer.
    assert other["comparison"] == compared
    assert any("final comparison read from the study" in note for note in other["notes"])
    # finish=True (`autotune tune --finish`) reads it back without measuring anything.
    runner = FakeRunner(behaviour)
    record = run_tune("m.py", global_batch=4, settings=TrialSettings(model_file="m.py", timeout_s=5),
                  runner=runner, blocks=1, baseline=Plan(micro_batch=1, grad_accum=4), trials=6,
                  storage=str(storage), repeats=2, finish=True)  # fmt: skip
    assert runner.plans == []
    assert record.comparison is not None
    assert record.comparison.model_dump(mode="json") == compared
    assert record.recommendation is not None


def test_a_rerun_reads_the_comparison_instead_of_measuring_again(tmp_path: Path) -> None:
    options = {"global_batch": 8, "settings": TrialSettings(model_file="m.py", timeout_s=5),
               "blocks": 1, "trials": 4, "storage": str(tmp_path / "s.db"), "repeats": 2}  # fmt: skip
    first = run_tune("m.py", runner=FakeRunner(behaviour), **options)  # type: ignore[arg-type]
    again = FakeRunner(behaviour)
    second = run_tune("m.py", runner=again, **options)  # type: ignore[arg-type]
    assert again.plans == [], "a finished study was measured again"
    assert second.comparison == first.comparison
    assert any("read from the study" in note for note in second.notes)
    # A comparison that would measure something else (here: more repeats) is run anew,
    # and only that: the search is complete, so no trial is launched.
    more = FakeRunner(behaviour)
    third = run_tune("m.py", runner=more, **{**options, "repeats": 3})  # type: ignore[arg-type]
    assert third.comparison is not None and third.comparison.cap == 3
    assert third.comparison.reruns is not None
    assert len(more.plans) == sum(third.comparison.reruns) > 0
    assert not any("read from the study" in note for note in third.notes)


def test_a_trial_still_running_elsewhere_holds_the_comparison_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = str(tmp_path / "s.db")
    # the wait for the other worker's trial: 4 launches' time-out and 3 heartbeats, 7 s
    options = {"global_batch": 8, "settings": TrialSettings(model_file="m.py", timeout_s=1),
               "blocks": 1, "trials": 2, "storage": storage, "repeats": 1, "heartbeat_s": 1}  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{storage}", study_name="autotune",
                                direction="maximize")  # fmt: skip
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        running = study.ask()  # a trial of another live worker on this host
        running.set_user_attr("host", socket.gethostname())
        running.set_user_attr("pid", sleeper.pid)
        runner = FakeRunner(behaviour)
        record = run_tune("m.py", runner=runner, **options)  # type: ignore[arg-type]
        assert len(runner.plans) == 2, "the search ran; the comparison did not"
        assert record.comparison is None and record.recommendation is None
        assert any(f"trial(s) {running.number} still running" in n for n in record.notes)
        # the wait said what it waited for, and for how long at most
        told = capsys.readouterr().err
        assert (f"autotune: waiting up to 7 s for trial(s) {running.number} (pid {sleeper.pid} "
                f"on {socket.gethostname()}) of other workers to finish") in told  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()
    # That worker gone, --finish runs the comparison.
    runner = FakeRunner(behaviour)
    record = run_tune("m.py", runner=runner, finish=True, **options)  # type: ignore[arg-type]
    assert record.comparison is not None and record.recommendation is not None
    assert record.comparison.reruns is not None
    assert len(runner.plans) == sum(record.comparison.reruns)


def test_the_claim_goes_to_exactly_one_caller_per_key(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    assert claim(study, "4t-3r") is True
    assert claim(study, "4t-3r") is False
    assert claim(study, "5t-3r") is True


def _done(number: int, micro_batch: int, speed: float, role: str = "search") -> TrialRecord:
    plan = Plan(micro_batch=micro_batch, grad_accum=8 // micro_batch)
    step = 8 / speed  # the median step time's interval: +-5 %
    return TrialRecord(number=number, plan=plan, role=role, state="complete", outcome="ok",
                       samples_per_s=speed, step_time=step,
                       step_interval=(0.95 * step, 1.05 * step))  # type: ignore[arg-type]  # fmt: skip


def test_the_key_changes_only_when_what_would_be_compared_changes() -> None:
    base = _done(0, 8, 10.0, "baseline")
    trials = [base, _done(1, 4, 14.0), _done(2, 2, 12.0)]
    key = comparison_key(best_records(trials), base, 2)
    # A slower trial whose interval does not reach the best's leaves the comparison as it was ...
    assert comparison_key(best_records([*trials, _done(3, 1, 9.0)]), base, 2) == key
    # ... a new best, one overlapping the best, or another cap makes another one due.
    assert comparison_key(best_records([*trials, _done(3, 1, 20.0)]), base, 2) != key
    assert comparison_key(best_records([*trials, _done(3, 1, 13.0)]), base, 2) != key
    assert comparison_key(best_records(trials), base, 3) != key


def test_a_worker_that_loses_the_claim_waits_for_the_result(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=url, study_name="autotune")
    base = _done(0, 8, 10.0, "baseline")
    ranked = best_records([base, _done(1, 4, 14.0), _done(2, 2, 12.0)])
    settings = TrialSettings(model_file="m.py", timeout_s=1)  # each run's length: unknown here
    key = comparison_key(ranked, base, 0)
    assert claim(study, key)  # another worker's: it writes its result a second later
    theirs = compare(FakeRunner(behaviour), settings, ranked, base, 0)
    elsewhere = optuna.load_study(study_name="autotune", storage=url)
    writer = threading.Timer(1.0, write, (elsewhere, key, theirs))
    writer.start()
    runner, notes = FakeRunner(behaviour), []
    got = final_comparison(study, ranked, base, runner, settings, 0, notes)
    writer.join()
    assert got == theirs and runner.plans == [], "read, not measured again"
    assert any("final comparison read from the study" in note for note in notes)
    # A claimant that never writes: given up after its longest comparison, with a note;
    # --finish reads it later. Three search runs of 0.25 s, 30 % of which the re-runs may take,
    # and a round in flight of the best, the baseline, the runner-up and the twin, given twice
    # their 0.25 s: 0.225 + 2 s.
    more = [r.model_copy(update={"duration_s": 0.25})
            for r in best_records([base, _done(1, 4, 14.0), _done(2, 2, 13.9)])]  # fmt: skip
    timed_base = next(r for r in more if r.role == "baseline")
    assert claim(study, comparison_key(more, timed_base, 0))
    notes = []
    assert final_comparison(study, more, timed_base, runner, settings, 0, notes) is None
    assert runner.plans == []
    assert any("not written after 2 s" in note and "--finish" in note for note in notes)
