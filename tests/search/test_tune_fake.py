"""run_tune() with the fake runner: pruning, OOM lessons, the comparison, resuming, two workers."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _search import run_tune

from autotune.records import LinkMeasure, Plan
from autotune.search import Prediction, TrialResult, TrialSettings
from autotune.search._runner import FakeRunner

BUDGET = 1000


def peak(plan: Plan) -> int:
    """A made-up memory model: activations grow with micro-batch, checkpointing halves them."""
    return 200 + plan.micro_batch * (100 - 40 * plan.checkpoint_blocks)


def behaviour(plan: Plan, settings: TrialSettings) -> TrialResult:
    speed = 10.0 + plan.micro_batch - 2.0 * plan.checkpoint_blocks
    return TrialResult(completed_steps=4, samples_per_s=speed, tokens_per_s=speed * 16,
                       peak_memory_bytes=[peak(plan)], peak_source="fake",
                       device_memory=settings.device_memory)  # fmt: skip


def predict(plan: Plan) -> Prediction:
    estimate = peak(plan)
    return Prediction(estimate <= BUDGET, estimate, "formula", f"peak {estimate} > {BUDGET}")


def settings(tmp_path: Path) -> TrialSettings:
    return TrialSettings(model_file=str(tmp_path / "model.py"), device_memory=BUDGET, timeout_s=5)


def test_misfits_are_pruned_unrun_and_the_policy_goes_first(tmp_path: Path) -> None:
    runner = FakeRunner(behaviour)
    # Checkpointing pays here: without both blocks micro-batch 16 is predicted not to fit.
    policy = Plan(micro_batch=16, checkpoint_blocks=2)
    record = run_tune(
        "model.py", global_batch=16, settings=settings(tmp_path), runner=runner, blocks=2,
        policy=policy, baseline=Plan(micro_batch=16), predict=predict, trials=6,
        storage=str(tmp_path / "s.db"), repeats=2,
    )  # fmt: skip
    first = record.trials[0]
    assert first.role == "policy" and runner.plans[0] == policy
    baseline = next(t for t in record.trials if t.role == "baseline")
    # The baseline (mb=16, no checkpointing) is predicted at 1800 > 1000: pruned, never run.
    assert baseline.state == "pruned" and "predicted not to fit" in (baseline.reason or "")
    run = {p.model_dump_json() for p in runner.plans}
    for trial in record.trials:
        if trial.reason and trial.reason.startswith("predicted not to fit"):
            assert trial.plan.model_dump_json() not in run
            assert peak(trial.plan) > BUDGET
    measured = [t for t in record.trials if t.outcome is not None]
    # Five plans fit and pay for their knobs: micro-batch 1-8 plain, 16 with both blocks.
    assert len(measured) == 5
    assert all(t.outcome == "ok" and peak(t.plan) <= BUDGET for t in measured)
    for trial in measured:  # checkpointing ran only where the plan without it does not fit
        if trial.plan.checkpoint_blocks:
            assert peak(trial.plan.with_changes(checkpoint_blocks=0)) > BUDGET
    rec = record.recommendation
    assert rec is not None and rec.source == "tune"
    best = max(measured, key=lambda t: t.samples_per_s or 0)
    # Identical runs separate after one round: the search's run and one re-run.
    assert rec.plan == best.plan and rec.best is not None and rec.best.repeats == 2
    assert rec.speedup is None  # the baseline never ran
    assert record.objective == "tokens_per_s"


def test_measured_oom_teaches_the_search(tmp_path: Path) -> None:
    def oom_from_two(plan: Plan, s: TrialSettings) -> TrialResult | str:
        return (
            "oom" if plan.micro_batch >= 2 and plan.checkpoint_blocks == 0 else behaviour(plan, s)
        )

    runner = FakeRunner(oom_from_two)
    record = run_tune(
        "model.py", global_batch=8, settings=settings(tmp_path), runner=runner, blocks=1,
        policy=Plan(micro_batch=2, grad_accum=4), baseline=Plan(micro_batch=1, grad_accum=8),
        trials=8, storage=str(tmp_path / "s.db"), repeats=1,
    )  # fmt: skip
    # The policy's plan (mb=2, no checkpointing) runs first and runs out of memory.
    assert record.trials[0].outcome == "oom" and record.trials[0].state == "pruned"
    ran = [p for p in runner.plans if p.checkpoint_blocks == 0]
    assert [p.micro_batch for p in ran if p.micro_batch > 2] == []
    taught = {t.plan.micro_batch for t in record.trials if "ran out of memory" in (t.reason or "")}
    assert {4, 8} <= taught
    assert all(
        t.outcome is None
        for t in record.trials
        if t.plan.micro_batch in (4, 8) and t.plan.checkpoint_blocks == 0
    )
    # The whole space (4 micro-batches x 2) was decided; 6 of the 8 plans could run.
    assert len({t.plan for t in record.trials if t.state != "running"}) == 8
    rec = record.recommendation
    assert rec is not None and rec.baseline is not None and rec.plan.checkpoint_blocks == 1
    assert rec.speedup is not None and rec.speedup > 1


SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from autotune.records import Plan
    from autotune.search import TrialResult, TrialSettings
    from autotune.search._runner import FakeRunner

    sys.path.insert(0, os.environ["AUTOTUNE_TESTS"])
    from _search import run_tune

    storage, trials, kill_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    delay = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05

    def behaviour(plan, settings):
        if plan.micro_batch == kill_mb and plan.checkpoint_blocks == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-trial, at a known plan: no timer race
        speed = 10.0 + plan.micro_batch - plan.checkpoint_blocks
        return TrialResult(completed_steps=2, samples_per_s=speed, peak_memory_bytes=[1])

    runner = FakeRunner(behaviour, delay_s=delay)
    settings = TrialSettings(model_file="m.py", timeout_s=5)
    record = run_tune("m.py", global_batch=16, settings=settings, runner=runner, blocks=3,
                  baseline=Plan(micro_batch=1, grad_accum=16), trials=trials, storage=storage,
                  repeats=0, heartbeat_s=1)
    print(json.dumps({"ran": [p.model_dump(mode="json") for p in runner.plans],
                      "pid": os.getpid(), "notes": record.notes}))
    """
)


def _run(script: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "AUTOTUNE_TESTS": str(Path(__file__).parent.parent),
    }
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def test_killed_study_resumes_without_losing_or_redoing_trials(tmp_path: Path) -> None:
    script = tmp_path / "study.py"
    script.write_text(SCRIPT)
    storage = tmp_path / "study.db"
    # Micro-batch 16 without checkpointing kills the study mid-trial; the baseline runs first.
    killed = subprocess.Popen([sys.executable, str(script), str(storage), "6", "1"],
                              env={**os.environ, "OMP_NUM_THREADS": "1",
                                   "AUTOTUNE_TESTS": str(Path(__file__).parent.parent)})  # fmt: skip
    assert killed.wait(timeout=120) == -9
    import optuna

    study = optuna.load_study(study_name="autotune", storage=f"sqlite:///{storage}")
    before = {t.number: t for t in study.get_trials()}
    left_running = [t for t in before.values() if t.state.name == "RUNNING"]
    finished = [t for t in before.values() if t.state.is_finished()]
    assert len(left_running) == 1
    resumed = _run(script, storage, 6, 0)
    assert resumed.returncode == 0, resumed.stderr
    ran = [Plan.model_validate(p) for p in json.loads(resumed.stdout)["ran"]]
    done_plans = [Plan.model_validate(t.user_attrs["plan"]) for t in finished]
    assert not set(map(str, done_plans)) & set(map(str, ran)), "a finished trial was redone"
    stale_plan = Plan.model_validate(left_running[0].user_attrs["plan"])
    # Owed first: the resumed run measures the plan it was left running before anything new,
    # found at once (its process is gone), not after three silent heartbeats.
    assert ran[0] == stale_plan, "the trial left running was not rerun first"
    after = optuna.load_study(study_name="autotune", storage=f"sqlite:///{storage}").get_trials()
    stale = after[left_running[0].number]
    assert stale.state.name == "FAIL"
    assert stale.user_attrs["reason"].startswith(
        f"left running by a killed process (pid {killed.pid})"
    )
    assert any("left running by a killed process" in n for n in json.loads(resumed.stdout)["notes"])
    assert all(after[t.number].state == t.state for t in finished)
    measured = [t for t in after if t.user_attrs.get("outcome")]
    assert len(measured) == 6


def test_two_workers_share_one_study(tmp_path: Path) -> None:
    script = tmp_path / "study.py"
    script.write_text(SCRIPT)
    storage = tmp_path / "shared.db"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "AUTOTUNE_TESTS": str(Path(__file__).parent.parent),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(storage), "8", "0", "0.5"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=180) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    import optuna

    trials = optuna.load_study(study_name="autotune", storage=f"sqlite:///{storage}").get_trials()
    measured = [t for t in trials if t.user_attrs.get("outcome")]
    plans = [json.dumps(t.user_attrs["plan"], sort_keys=True) for t in measured]
    assert len(plans) == len(set(plans)), "two workers measured the same plan"
    assert 8 <= len(measured) <= 9  # each stops once the shared study has 8; one may be in flight
    assert len({t.user_attrs["pid"] for t in measured}) == 2


BARRIER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from autotune.search import open_study

    study = open_study(sys.argv[1], "queue", heartbeat_s=1)
    print("ready", flush=True)
    go, deadline = Path(sys.argv[2]), time.monotonic() + 60
    while not go.exists():
        assert time.monotonic() < deadline, f"no {go} after 60 s"
        time.sleep(0.001)
    """
)
TAKER = BARRIER + textwrap.dedent(
    """
    from autotune.search._space import make_space
    from autotune.search._study import ask

    space = make_space(8, 1, 2, None, None)
    print(json.dumps([ask(study, space)[0].number for _ in range(int(sys.argv[3]))]), flush=True)
    """
)
FAILER = BARRIER + textwrap.dedent(
    """
    from autotune.search._study import fail_dead_local, recover_stale

    print(json.dumps((fail_dead_local if sys.argv[3] == "dead" else recover_stale)(study)))
    """
)


def _storage(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return str(tmp_path / "s.db")
    return str(request.getfixturevalue("postgres_url"))


def _two_at_once(script: str, storage: str, tmp_path: Path, arg: str) -> list[str]:
    """Run ``script`` in two processes with the study open, released together; their outputs."""
    path, go = tmp_path / "worker.py", tmp_path / "go"
    path.write_text(script)
    command = [sys.executable, str(path), storage, str(go), arg]
    procs = [subprocess.Popen(command, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]  # fmt: skip
    try:
        for proc in procs:  # both have the study open: they start together
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        go.touch()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    return [out for out, _ in outputs]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_workers_never_take_one_queued_trial(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two workers take 60 queued trials at once; each is taken by exactly one. Before
    stop 58, on sqlite both could read a trial WAITING and both run it; the second to
    finish it then fails with Optuna's UpdateFinishedTrialError, as two workers sharing
    a study did in stop 57's CI."""
    from autotune.search import open_study

    storage = _storage(backend, tmp_path, request)
    study = open_study(storage, "queue")
    for x in range(60):
        study.enqueue_trial({"x": x})
    taken = [json.loads(out) for out in _two_at_once(TAKER, storage, tmp_path, "30")]
    assert sorted(taken[0] + taken[1]) == list(range(60))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize("how", ["dead", "stale"])
def test_a_trial_two_workers_fail_at_once_is_queued_again_once(
    how: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """60 running trials are lost: their worker's pid is gone ("dead", which a worker on
    the same host fails at once) or their heartbeats stopped ("stale", failed by Optuna's
    fail_stale_trials and re-queued by its retry callback). Two workers recover them at
    once; each is queued again exactly once, so no plan is measured twice. Before stop 59,
    on sqlite both workers could fail one trial and both queue it."""
    import socket

    from optuna.trial import TrialState

    from autotune.search import open_study
    from autotune.search._study import RETRY_OF, beat

    storage = _storage(backend, tmp_path, request)
    study = open_study(storage, "queue", heartbeat_s=1)
    gone = 2**22 + 1  # above Linux's largest pid_max: no process has it
    lost = []
    for _ in range(60):
        trial = study.ask()
        for key, value in {"plan": Plan().model_dump(mode="json"), "host": socket.gethostname(),
                           "pid": gone}.items():  # fmt: skip
            trial.set_user_attr(key, value)
        beat(study, trial)
        lost.append(trial.number)
    if how == "stale":
        time.sleep(3.5)  # past the grace of three 1-s heartbeats
    _two_at_once(FAILER, storage, tmp_path, how)
    queued = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    origins = sorted(
        t.user_attrs[RETRY_OF] if how == "dead" else t.system_attrs["failed_trial"] for t in queued
    )
    assert origins == lost


def test_of_two_workers_that_draw_one_plan_the_lower_trial_runs_it(tmp_path: Path) -> None:
    """Another worker's trial 0 is created first but names its plan late (its sampler is
    slow); this worker's trial 1 draws the same plan and must leave it to trial 0."""
    import threading

    import optuna

    plan = Plan(micro_batch=16)
    url = f"sqlite:///{tmp_path / 's.db'}"
    other = optuna.create_study(storage=url, study_name="autotune", direction="maximize")
    early = other.ask()  # trial 0: numbered, running, no plan yet

    def other_worker() -> None:
        time.sleep(0.5)
        early.set_user_attr("plan", plan.model_dump(mode="json"))
        time.sleep(0.5)
        early.set_user_attr("outcome", "ok")
        other.tell(early, 26.0)

    thread = threading.Thread(target=other_worker)
    thread.start()
    runner = FakeRunner(behaviour)
    record = run_tune(
        "model.py", global_batch=16, settings=settings(tmp_path), runner=runner,
        policy=plan, baseline=plan, trials=1, storage=url, repeats=0, heartbeat_s=1,
    )  # fmt: skip
    thread.join()
    assert plan not in runner.plans
    mine = next(t for t in record.trials if t.number == 1)
    assert mine.plan == plan and mine.reason == "same plan as trial 0"


def test_a_trial_counted_in_flight_that_ends_unmeasured_is_made_up(tmp_path: Path) -> None:
    """Another worker's running trial counts towards ``--trials`` while it runs; this worker
    waits for it at the end, and when it ends without a measure (pruned) measures one plan
    more, so the study measures ``--trials``. Before stop 61 the worker stopped one short (the
    baseline queued, never run), and one that stopped while the other went on had no
    recommendation: a way for a worker of the two PostgreSQL workers' test to end without one,
    as one did once in stop 60's CI."""
    import threading

    import optuna

    url = f"sqlite:///{tmp_path / 's.db'}"
    other = optuna.create_study(storage=url, study_name="autotune", direction="maximize")
    theirs = other.ask()  # trial 0, running its plan on another worker
    theirs.set_user_attr("plan", Plan(micro_batch=2).model_dump(mode="json"))

    def other_worker() -> None:
        time.sleep(2.0)
        other.tell(theirs, state=optuna.trial.TrialState.PRUNED)

    thread = threading.Thread(target=other_worker)
    thread.start()
    runner = FakeRunner(behaviour)
    policy, baseline = Plan(micro_batch=8, grad_accum=2), Plan(micro_batch=4, grad_accum=4)
    record = run_tune("model.py", global_batch=16, settings=settings(tmp_path), runner=runner,
                      policy=policy, baseline=baseline, trials=2, storage=url,
                      repeats=0)  # fmt: skip
    thread.join()
    assert runner.plans == [policy, baseline]
    assert sum(t.outcome == "ok" for t in record.trials) == 2
    assert record.recommendation is not None


def test_a_bf16_policy_without_baseline_still_measures_the_users_fp32_plan(
    tmp_path: Path,
) -> None:
    """On a CPU with fast bf16 (AMX) the policy proposes autocast; no --baseline was given, so
    the baseline is the user's plan as written: fp32, at the full per-rank batch."""
    runner = FakeRunner(behaviour)
    record = run_tune(
        "model.py", global_batch=8, settings=settings(tmp_path), runner=runner,
        policy=Plan(precision="amp_bf16", micro_batch=8), trials=2,
        storage=str(tmp_path / "s.db"), repeats=0,
    )  # fmt: skip
    baseline = next(t for t in record.trials if t.role == "baseline")
    assert baseline.plan == Plan(micro_batch=8) and baseline.plan.precision == "fp32"
    assert Plan(micro_batch=8) in runner.plans
    assert Plan(precision="amp_bf16", micro_batch=8) in runner.plans


def test_time_budget_stops_the_study(tmp_path: Path) -> None:
    runner = FakeRunner(behaviour, delay_s=0.3)
    record = run_tune(
        "model.py", global_batch=16, settings=settings(tmp_path), runner=runner, blocks=2,
        trials=50, budget_s=0.5, storage=str(tmp_path / "s.db"), repeats=0,
    )  # fmt: skip
    measured = [t for t in record.trials if t.outcome is not None]
    assert 1 <= len(measured) <= 3  # stops starting trials once the budget is spent
    assert record.recommendation is not None


def test_rerun_medians_not_search_numbers_pick_the_winner(tmp_path: Path) -> None:
    seen: dict[Plan, int] = {}

    def noisy(plan: Plan, s: TrialSettings) -> TrialResult:
        # The search run of micro-batch 4 is lucky; its re-runs are slower than the baseline's.
        seen[plan] = seen.get(plan, 0) + 1
        speed = 50.0 if plan.micro_batch == 4 and seen[plan] == 1 else 10.0 + plan.micro_batch
        if plan.micro_batch == 4 and seen[plan] > 1:
            speed = 5.0
        return TrialResult(completed_steps=2, samples_per_s=speed, peak_memory_bytes=[1])

    record = run_tune(
        "model.py", global_batch=8, settings=settings(tmp_path), runner=FakeRunner(noisy),
        baseline=Plan(micro_batch=8), trials=4, storage=str(tmp_path / "s.db"), repeats=3,
    )  # fmt: skip
    comparison, rec = record.comparison, record.recommendation
    assert comparison is not None and rec is not None
    assert comparison.labels[0] == "search best" and comparison.measured[0].plan.micro_batch == 4
    assert comparison.labels[comparison.winner] == "baseline"
    assert rec.plan == Plan(micro_batch=8) and rec.speedup == 1.0
    # Still overlapping after 3 rounds (the lucky search run widens micro-batch 4's range):
    # the baseline's median is over its search run and 3 re-runs.
    assert comparison.repeats == 3 and comparison.reruns is not None
    assert rec.best is not None and rec.best.repeats == 4
    assert any("measured fastest in the re-runs" in note for note in rec.notes)


def test_repeats_0_compares_the_single_search_runs_and_says_so(tmp_path: Path) -> None:
    def lucky(plan: Plan, s: TrialSettings) -> TrialResult:
        speed = 50.0 if plan.micro_batch == 4 else 10.0 + plan.micro_batch
        return TrialResult(completed_steps=2, samples_per_s=speed, peak_memory_bytes=[1])

    runner = FakeRunner(lucky)
    record = run_tune(
        "model.py", global_batch=8, settings=settings(tmp_path), runner=runner,
        baseline=Plan(micro_batch=8), trials=4, storage=str(tmp_path / "s.db"), repeats=0,
    )  # fmt: skip
    comparison, rec = record.comparison, record.recommendation
    assert comparison is not None and rec is not None and comparison.repeats == 0
    assert len(runner.plans) == 4, "repeats=0 re-ran a plan"
    # The single search runs decide: 50 / 18 samples/s, with no interval.
    assert rec.plan.micro_batch == 4 and rec.speedup == 50.0 / 18.0
    assert rec.speedup_interval is None
    assert any(n.startswith("repeats=0: nothing re-run") for n in rec.notes)


def test_budget_and_prediction_meet_the_live_tensor_peak_not_rss(tmp_path: Path) -> None:
    def worker_like(plan: Plan, s: TrialSettings) -> TrialResult:
        # What the real CPU worker reports: the live-tensor peak judged, RSS growth 6x beside it.
        live = peak(plan)
        return TrialResult(completed_steps=2, samples_per_s=10.0 + plan.micro_batch,
                           peak_memory_bytes=[live], peak_source="cpu_live_tensors",
                           live_tensor_bytes=[live], rss_delta_bytes=[6 * live],
                           device_memory=s.device_memory)  # fmt: skip

    record = run_tune(
        "model.py", global_batch=4, settings=settings(tmp_path), runner=FakeRunner(worker_like),
        blocks=1, baseline=Plan(micro_batch=1, grad_accum=4), predict=predict, trials=8,
        storage=str(tmp_path / "s.db"), repeats=0,
    )  # fmt: skip
    measured = [t for t in record.trials if t.outcome is not None]
    assert measured and all(6 * peak(t.plan) > BUDGET for t in measured)  # all over on RSS
    for trial in measured:
        assert trial.outcome == "ok" and trial.peak_source == "cpu_live_tensors"
        assert trial.peak_memory_bytes == trial.predicted_peak_bytes == peak(trial.plan)


def test_a_link_a_trial_swept_times_the_predictions_after_it(tmp_path: Path) -> None:
    """The first 2-rank trial brings back the link between its ranks; from then on every plan
    is predicted by ``relink(link)``, and the record keeps the link and says so."""
    from autotune.estimator import link_measure
    from autotune.records import EngineCost, LinkPoint

    points = [LinkPoint(collective=c, nbytes=size, seconds=1e-4 + size / 1e9, low=1e-4 + size / 1e9,
                        high=1e-4 + size / 1e9, repeats=1)
              for c in ("all_reduce", "all_gather", "reduce_scatter")
              for size in (2**16, 2**20)]  # fmt: skip
    costs = [EngineCost(engine=engine, micro_fixed_s=1e-3, micro_per_tensor_s=0.0,
                        step_fixed_s=1e-3, step_per_tensor_s=0.0, blocks=[4], per_block=[1],
                        steps=4) for engine in ("deepspeed-0-fp32", "fsdp2-2-fp32")]  # fmt: skip
    # the first engine's cost kept by an earlier sweep on this machine, the second measured
    link = link_measure(points, 2, "gloo").model_copy(update={
        "engine_costs": costs, "engine_costs_kept": ["deepspeed-0-fp32"],
        "engine_costs_file": "/cache/engine-costs/a.json"})  # fmt: skip

    sweeps: list[bool] = []
    engines: list[list[str]] = []

    def swept(plan: Plan, s: TrialSettings) -> TrialResult:
        sweeps.append(s.sweep_link)
        engines.append(s.engine_costs)
        return behaviour(plan, s).model_copy(update={"link": link if s.sweep_link else None})

    relinked: list[LinkMeasure] = []

    def relink(measured: LinkMeasure) -> Any:
        relinked.append(measured)
        return lambda plan: dataclasses.replace(predict(plan), step_time_ratio=0.5)

    record = run_tune("model.py", global_batch=16, settings=settings(tmp_path),
                      runner=FakeRunner(swept), nproc=2, blocks=2, predict=predict,
                      relink=relink, trials=4, storage=str(tmp_path / "s.db"),
                      repeats=0)  # fmt: skip
    assert relinked == [link] and record.link == link
    first = next(t for t in record.trials if t.link is not None)
    later = [t for t in record.trials if t.number > first.number and t.outcome is not None]
    assert later and all(t.predicted_step_ratio == 0.5 for t in later)
    assert all(t.predicted_step_ratio != 0.5 for t in record.trials if t.number <= first.number)
    (said,) = (note for note in record.notes if f"swept after trial {first.number}" in note)
    assert said.endswith("the engines' own costs: 1 kept from an earlier sweep on this machine "
                         "(/cache/engine-costs/a.json; delete it to measure them anew), 1 "
                         "measured after it")  # fmt: skip
    # one sweep is used, so the trials after it and the comparison's runs sweep none
    assert sweeps[0] and not any(sweeps[1:]) and len(sweeps) > 1
    # the sweep also measures the engines of the plans that may run: every stage of both
    # engines (a model file's tune searches FSDP2 too) fits this memory model, and fp32 is the
    # space's one precision
    assert engines[0] == [*(f"deepspeed-{stage}-fp32" for stage in range(4)),
                          "fsdp2-2-fp32", "fsdp2-3-fp32"]  # fmt: skip


def test_the_sweep_measures_no_engine_that_no_fitting_plan_runs(tmp_path: Path) -> None:
    """ZeRO-3 predicted never to fit: its engines' costs are not measured (DeepSpeed's, FSDP2's)."""
    asked: list[list[str]] = []

    def run(plan: Plan, s: TrialSettings) -> TrialResult:
        asked.append(s.engine_costs)
        return behaviour(plan, s)

    def no_stage3(plan: Plan) -> Prediction:
        found = predict(plan)
        return dataclasses.replace(found, fits=found.fits and plan.zero_stage < 3)

    run_tune("model.py", global_batch=16, settings=settings(tmp_path), runner=FakeRunner(run),
             nproc=2, blocks=2, predict=no_stage3, relink=lambda link: no_stage3, trials=2,
             storage=str(tmp_path / "s.db"), repeats=0)  # fmt: skip
    assert asked[0] == [*(f"deepspeed-{stage}-fp32" for stage in range(3)), "fsdp2-2-fp32"]


def _attention_runner(sdpa_speedup: float) -> FakeRunner:
    """``behaviour``'s speeds, times ``sdpa_speedup`` for a plan with fused attention; a step
    time with a 2 % interval, so the two kernels separate unless they run within it."""

    def run(plan: Plan, settings: TrialSettings) -> TrialResult:
        speed = (10.0 + plan.micro_batch) * (sdpa_speedup if plan.attention == "sdpa" else 1.0)
        return TrialResult(completed_steps=4, samples_per_s=speed, step_time=16 / speed,
                           step_interval=(16 / speed * 0.99, 16 / speed * 1.01),
                           peak_memory_bytes=[peak(plan)], peak_source="fake",
                           device_memory=settings.device_memory)  # fmt: skip

    return FakeRunner(run)


@pytest.mark.parametrize("sdpa_speedup", [0.8, 1.25])
def test_the_policys_code_change_is_decided_on_its_own_plan_then_held(
    tmp_path: Path, sdpa_speedup: float
) -> None:
    """The policy's fused attention is measured against the model as written on the policy's
    own plan, second in the queue and on top of the trials asked for. Where it is slower (as on
    a CPU at 124M), every later trial runs the code as written and the final comparison runs no
    twin; where it pays, every trial keeps it, and the comparison runs no twin either: the
    search measured it."""
    runner = _attention_runner(sdpa_speedup)
    policy = Plan(micro_batch=4, grad_accum=4, attention="sdpa")
    record = run_tune(
        "model.py", global_batch=16, settings=settings(tmp_path), runner=runner, blocks=2,
        policy=policy, baseline=Plan(micro_batch=16), predict=predict, trials=5,
        storage=str(tmp_path / "s.db"), repeats=2,
    )  # fmt: skip
    first, second = record.trials[:2]
    assert (first.role, first.plan) == ("policy", policy)
    assert (second.role, second.plan) == ("unchanged", policy.with_changes(attention="default"))
    pays = sdpa_speedup > 1
    # the twin decides the code change; it is not one of the --trials plans
    assert len([t for t in record.trials if t.outcome is not None and t.role != "unchanged"]) == 5
    later = [t for t in record.trials[2:] if t.outcome is not None]
    assert later and all(t.plan.attention == ("sdpa" if pays else "default") for t in later)
    searched = len([t for t in record.trials if t.outcome is not None])
    assert record.comparison is not None and record.comparison.labels[0] == "search best"
    assert "search best, model code unchanged" not in record.comparison.labels
    # Every run past the search's is a re-run of a plan the search measured.
    assert {p for p in runner.plans[searched:]} <= {t.plan for t in record.trials}
    rec = record.recommendation
    assert rec is not None and rec.plan.attention == ("sdpa" if pays else "default")
    said = "kept for every plan" if pays else "runs the model's code as written"
    assert any(said in note for note in record.notes), record.notes
