"""The cost model steers the search: the predicted front runs early, plans predicted slower than
the best measured one beyond the error bar are skipped (with the reason), never run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _search import run_tune

from autotune.records import Plan
from autotune.search import Prediction, TrialRecord, TrialResult, TrialSettings, TuneRecord
from autotune.search._runner import FakeRunner
from autotune.search._space import make_space
from autotune.search._steer import error_bar, predicted_front, slower_than_best


def step_seconds(plan: Plan) -> float:
    """A made-up machine: a fixed cost per micro-batch, recompute per checkpointed block,
    ZeRO-3 slower (communication the model below does not see)."""
    micro = 0.01 + 0.01 * plan.micro_batch + 0.004 * plan.micro_batch * plan.checkpoint_blocks
    return plan.grad_accum * micro * (1.5 if plan.zero_stage == 3 else 1.0)


def predict(plan: Plan) -> Prediction:
    """The model of that machine, blind to ZeRO's cost, as the estimate is without a bandwidth."""
    micro = 0.01 + 0.01 * plan.micro_batch + 0.004 * plan.micro_batch * plan.checkpoint_blocks
    return Prediction(True, 1000, "formula", step_time_ratio=plan.grad_accum * micro)


def behaviour(plan: Plan, settings: TrialSettings) -> TrialResult:
    seconds = step_seconds(plan)
    return TrialResult(completed_steps=4, samples_per_s=plan.global_batch / seconds,
                       step_time=seconds, step_times=[seconds] * 3, peak_memory_bytes=[1000],
                       peak_source="fake", reused=True, first_step_at=None)  # fmt: skip


def test_front_is_the_fastest_predicted_plan_of_each_stage() -> None:
    space = make_space(32, 2, 3, None, None)
    front = predicted_front(space, predict)
    # Fewest micro-batches (16 per rank, one micro-batch) and no recompute, for stages 0-3.
    assert [(p.micro_batch, p.grad_accum, p.checkpoint_blocks) for p in front] == [(16, 1, 0)] * 4
    assert sorted(p.zero_stage for p in front) == [0, 1, 2, 3]


def _tune(tmp_path: Path, runner: FakeRunner, trials: int) -> TuneRecord:
    baseline = Plan(micro_batch=1, grad_accum=16, nproc_per_node=2)
    policy = Plan(micro_batch=2, grad_accum=8, nproc_per_node=2, zero_stage=2)
    return run_tune(
        "model.py", global_batch=32, settings=TrialSettings(model_file="model.py"), runner=runner,
        nproc=2, blocks=3, policy=policy, baseline=baseline, predict=predict, trials=trials,
        storage=str(tmp_path / "s.db"), repeats=0, seed=1,
    )  # fmt: skip


def test_slow_predictions_are_skipped_never_run_and_lose_nothing(tmp_path: Path) -> None:
    runner = FakeRunner(behaviour)
    record = _tune(tmp_path, runner, trials=30)
    roles = [t.role for t in record.trials[:6]]
    assert roles == ["policy", "baseline"] + ["predicted"] * 4
    ran = {p.model_dump_json() for p in runner.plans}
    best = min(step_seconds(Plan.model_validate_json(p)) for p in ran)
    for trial in record.trials:
        if (trial.reason or "").startswith("predicted x"):  # a plan the sampler proposed
            assert trial.state == "pruned" and trial.plan.model_dump_json() not in ran
            assert "beyond the estimate's error bar" in (trial.reason or "")
    # Every plan of the space left unrun is truly no faster than the best measured one.
    for plan in make_space(32, 2, 3, None, None).all_plans():
        if plan.model_dump_json() not in ran:
            assert step_seconds(plan) >= best, plan.describe()
    # The baseline ran although the model ranks it slowest: the speedup needs it.
    assert any(t.role == "baseline" and t.outcome == "ok" for t in record.trials)
    # Far fewer than the 80 plans (or the 30 trials allowed) ran: the rest were predicted slow.
    assert len(ran) < 20 and any(note.startswith("stopped after") for note in record.notes)
    assert record.recommendation is not None
    assert step_seconds(record.recommendation.plan) == best
    fastest = min(step_seconds(plan) for plan in make_space(32, 2, 3, None, None).all_plans())
    assert best == fastest


def shared_host_seconds(plan: Plan) -> float:
    """A made-up host whose ranks share its memory: past a few samples a larger micro-batch
    costs more per sample, against the model's fixed part per micro-batch (fastest: mb=4)."""
    return plan.grad_accum * (0.005 + 0.01 * plan.micro_batch * (1 + 0.05 * plan.micro_batch))


def test_the_best_plans_micro_batch_neighbours_are_measured_not_predicted(
    tmp_path: Path,
) -> None:
    def on_host(plan: Plan, settings: TrialSettings) -> TrialResult:
        seconds = shared_host_seconds(plan)
        return TrialResult(completed_steps=4, samples_per_s=plan.global_batch / seconds,
                           step_time=seconds, step_times=[seconds] * 3, peak_memory_bytes=[1000],
                           peak_source="fake", reused=True, first_step_at=None)  # fmt: skip

    runner = FakeRunner(on_host)
    largest = Plan(micro_batch=16, nproc_per_node=2)
    record = run_tune(
        "model.py", global_batch=32, settings=TrialSettings(model_file="model.py"), runner=runner,
        nproc=2, blocks=3, policy=largest.with_changes(zero_stage=1), baseline=largest,
        predict=predict, trials=10, storage=str(tmp_path / "s.db"), repeats=0, seed=1,
    )  # fmt: skip
    fastest = min(make_space(32, 2, 3, None, None).all_plans(), key=shared_host_seconds)
    assert fastest.micro_batch == 4
    # the model ranks mb=4 x1.18 the step time of mb=16, past its 15 % error bar
    assert predict(fastest).step_time_ratio / predict(largest).step_time_ratio > 1.15  # type: ignore[operator]
    walked = [t.plan.micro_batch for t in record.trials if t.role == "neighbour"]
    assert walked[:2] == [8, 4]  # down from the front's best, one micro-batch at a time
    assert record.recommendation is not None
    assert shared_host_seconds(record.recommendation.plan) == shared_host_seconds(fastest)
    assert any("neighbours of the best measured plan" in n for n in record.notes)


def test_a_sharded_best_is_measured_again_at_the_lowest_stage_predicted_to_fit(
    tmp_path: Path,
) -> None:
    """The model ranks the stages by a hair (the sharded optimizer step, 1 %) and the front
    holds two plans, both sharded; on the machine the engines' own costs make ZeRO-0 6 %
    faster. The best measured plan's ZeRO-0 twin is queued as a neighbour, runs, and wins."""

    def seconds(plan: Plan) -> float:
        return plan.grad_accum * (0.01 + 0.01 * plan.micro_batch) * (1.0 if plan.zero_stage == 0 else 1.06)  # fmt: skip

    def sharded_optimizer(plan: Plan) -> Prediction:
        ratio = plan.grad_accum * (0.01 + 0.01 * plan.micro_batch) * (1.01 if plan.zero_stage == 0 else 1.0)  # fmt: skip
        return Prediction(True, 1000, "formula", step_time_ratio=ratio)

    def on_machine(plan: Plan, settings: TrialSettings) -> TrialResult:
        s = seconds(plan)
        return TrialResult(completed_steps=4, samples_per_s=plan.global_batch / s, step_time=s,
                           step_times=[s] * 3, peak_memory_bytes=[1000], peak_source="fake",
                           reused=True, first_step_at=None)  # fmt: skip

    runner = FakeRunner(on_machine)
    record = run_tune(
        "model.py", global_batch=32, settings=TrialSettings(model_file="model.py"), runner=runner,
        nproc=2, blocks=3, policy=Plan(micro_batch=16, nproc_per_node=2, zero_stage=1),
        baseline=Plan(micro_batch=1, grad_accum=16, nproc_per_node=2), predict=sharded_optimizer,
        trials=6, front=2, storage=str(tmp_path / "s.db"), repeats=0, seed=1,
    )  # fmt: skip
    front = [t.plan for t in record.trials if t.role == "predicted"]
    assert front and all(p.zero_stage > 0 for p in front)
    twin = Plan(micro_batch=16, nproc_per_node=2, zero_stage=0)
    assert any(
        t.plan == twin and t.role == "neighbour" and t.outcome == "ok" for t in record.trials
    )
    assert record.recommendation is not None and record.recommendation.plan == twin


def _record(number: int, predicted: float, measured: float) -> TrialRecord:
    return TrialRecord(number=number, plan=Plan(), state="complete", outcome="ok",
                       step_time=measured, predicted_step_ratio=predicted)  # fmt: skip


def test_error_bar_grows_only_when_a_plan_was_predicted_too_slow() -> None:
    assert error_bar([]) == 0.15
    # Predicted faster than measured (ZeRO-3's unseen communication): no risk for skips.
    assert error_bar([_record(0, 1.0, 1.0), _record(1, 1.0, 1.5)]) == 0.15
    # Predicted 2x the best, measured 1.25x: the model overstates slowness by 60 %.
    bar = error_bar([_record(0, 1.0, 1.0), _record(1, 2.0, 1.25)])
    assert abs(bar - 0.6) < 1e-9


def test_the_best_trials_noise_widens_the_bar() -> None:
    quiet = _record(0, 1.0, 1.0)
    noisy = quiet.model_copy(update={"step_interval": (0.9, 1.1)})  # +-10 % around the median
    slower = Prediction(True, 1000, "formula", step_time_ratio=1.25)  # 25 % slower than trial 0
    reason = slower_than_best(slower, [quiet])
    assert reason is not None and "error bar of 15%" in reason
    assert slower_than_best(slower, [noisy]) is None  # 25 % <= 15 % + 10 %


def test_a_single_runs_noise_is_at_least_the_spread_between_runs() -> None:
    """A run's own step times (+-1 % here) miss the spread between runs of one plan, so the
    prune adds RUN_SPREAD (5.5 %) at least: a plan predicted 19 % slower than the best measured
    one runs (19 % < 15 % + 5.5 %); 21 % slower is skipped."""
    tight = _record(0, 1.0, 1.0).model_copy(update={"step_interval": (0.99, 1.01)})
    for record in (tight, _record(0, 1.0, 1.0)):  # an interval of 2 %, and none at all
        assert slower_than_best(Prediction(True, 1000, "formula", step_time_ratio=1.19),
                                [record]) is None  # fmt: skip
        assert slower_than_best(Prediction(True, 1000, "formula", step_time_ratio=1.21),
                                [record]) is not None  # fmt: skip


def test_the_front_measures_each_engine_at_each_stage() -> None:
    """Keyed by stage alone, the engine predicted a hair ahead takes the stage's place: on the
    124M model DeepSpeed's ZeRO-2 did, predicted 2.3 % ahead of FSDP2's stage 2, and FSDP2's
    (the grid's best) was never measured. One plan per engine, stage and precision is."""
    space = make_space(32, 2, 0, None, None, engines=("deepspeed", "fsdp2"))

    def fsdp2_a_hair_behind(plan: Plan) -> Prediction:
        found = predict(plan)
        hair = 1.006 if plan.engine == "fsdp2" else 1.0
        return Prediction(
            True, 1000, "formula", step_time_ratio=(found.step_time_ratio or 0) * hair
        )

    front = predicted_front(space, fsdp2_a_hair_behind, size=6)
    expected = {("deepspeed", s) for s in range(4)} | {("fsdp2", 2), ("fsdp2", 3)}
    assert {(p.engine, p.zero_stage) for p in front} == expected
    assert all((p.micro_batch, p.grad_accum) == (16, 1) for p in front)


def test_with_several_ranks_the_front_waits_for_the_link_the_first_trial_sweeps(
    tmp_path: Path,
) -> None:
    """Blind to communication, the estimate ranks the largest micro-batch first; timed on the
    link the first trial sweeps, mb=4 (on this made-up host the fastest, as
    :func:`shared_host_seconds` has it). The front is queued once the link is known, from the
    estimate on it: it measures mb=4 at every stage, and the fastest plan is found."""
    from autotune.estimator import link_measure
    from autotune.records import LinkMeasure, LinkPoint

    points = [LinkPoint(collective=c, nbytes=size, seconds=1e-4 + size / 1e9, low=1e-4 + size / 1e9,
                        high=1e-4 + size / 1e9, repeats=1)
              for c in ("all_reduce", "all_gather", "reduce_scatter") for size in (2**16, 2**20)]  # fmt: skip
    link = link_measure(points, 2, "gloo")

    def on_link(plan: Plan) -> Prediction:
        return Prediction(True, 1000, "formula", step_time_ratio=shared_host_seconds(plan))

    def swept(plan: Plan, settings: TrialSettings) -> TrialResult:
        seconds = shared_host_seconds(plan)
        return TrialResult(completed_steps=4, samples_per_s=plan.global_batch / seconds,
                           step_time=seconds, step_times=[seconds] * 3, peak_memory_bytes=[1000],
                           peak_source="fake", reused=True, first_step_at=None,
                           link=link if settings.sweep_link else None)  # fmt: skip

    relinked: list[LinkMeasure] = []

    def relink(measured: LinkMeasure) -> Any:
        relinked.append(measured)
        return on_link

    largest = Plan(micro_batch=16, nproc_per_node=2)
    record = run_tune(
        "model.py", global_batch=32, settings=TrialSettings(model_file="model.py"),
        runner=FakeRunner(swept), nproc=2, blocks=3, policy=largest.with_changes(zero_stage=1),
        baseline=largest, predict=predict, relink=relink, trials=8, engines=("deepspeed",),
        storage=str(tmp_path / "s.db"), repeats=0, seed=1,
    )  # fmt: skip
    space = make_space(32, 2, 3, None, None)
    blind = predicted_front(space, predict)
    assert {p.micro_batch for p in blind} == {16}  # what the front would have been at the start
    assert relinked == [link]
    front = [t for t in record.trials if t.role == "predicted"]
    assert [t.plan for t in front] == predicted_front(space, on_link)
    assert {t.plan.micro_batch for t in front} == {4} and len(front) == 4
    assert all(t.number > record.trials[0].number for t in front)  # after the sweeping trial
    assert any(n.startswith("predicted front queued after the link's sweep") for n in record.notes)
    fastest = min(space.all_plans(), key=shared_host_seconds)
    assert record.recommendation is not None
    assert shared_host_seconds(record.recommendation.plan) == shared_host_seconds(fastest)


def test_a_worker_that_stops_on_the_predictions_waits_for_another_workers_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every plan left is predicted slower, but at that moment another worker has just asked for
    a trial (running, no plan yet). The worker waits for it, looks again, then stops, and runs
    the final comparison itself: it recommends. Before stop 61 it stopped at once, left the
    comparison to the worker still running, and recommended nothing."""
    import threading
    import time

    import optuna

    from autotune.search._tune import _Search

    url = f"sqlite:///{tmp_path / 's.db'}"
    threads: list[threading.Thread] = []
    worth = _Search.worth_running

    def worth_running(search: Any, records: list[TrialRecord]) -> bool:
        found = worth(search, records)
        if not found and not threads:  # the first time the search would stop
            other = optuna.load_study(study_name="autotune", storage=url)
            theirs = other.ask()

            def finish() -> None:
                time.sleep(1.0)
                theirs.set_user_attr(
                    "plan", Plan(micro_batch=16, nproc_per_node=2).model_dump(mode="json")
                )
                other.tell(theirs, state=optuna.trial.TrialState.PRUNED)

            threads.append(threading.Thread(target=finish))
            threads[0].start()
        return found

    monkeypatch.setattr(_Search, "worth_running", worth_running)
    record = _tune(tmp_path, FakeRunner(behaviour), trials=30)  # its study in tmp_path/s.db
    threads[0].join()
    assert any(note.startswith("stopped after") for note in record.notes)
    assert not any("still running on other workers" in note for note in record.notes)
    assert record.recommendation is not None


def test_a_trial_is_told_the_best_measured_step_time_and_says_when_it_stopped_on_it(
    tmp_path: Path,
) -> None:
    """Each trial after the first measured one runs with ``stop_slower_than_s``: the best
    measured plan's step-time interval's top, 5.5 % (the spread between runs) above it; the
    baseline, the speedup's denominator, is measured in full. A trial whose steps all came
    above it records why it stopped."""
    seen: list[tuple[Plan, float | None]] = []
    returned: list[tuple[float, float]] = []  # (samples/s, interval top) of each run so far

    def told(plan: Plan, settings: TrialSettings) -> TrialResult:
        seen.append((plan, settings.stop_slower_than_s))
        seconds = step_seconds(plan)
        returned.append((plan.global_batch / seconds, seconds * 1.02))
        return TrialResult(completed_steps=4, samples_per_s=plan.global_batch / seconds,
                           step_time=seconds, step_times=[seconds] * 3,
                           step_interval=(seconds * 0.98, seconds * 1.02),
                           peak_memory_bytes=[1000], peak_source="fake", reused=True,
                           first_step_at=None)  # fmt: skip

    record = _tune(tmp_path, FakeRunner(told), trials=8)
    baseline = Plan(micro_batch=1, grad_accum=16, nproc_per_node=2)
    assert seen[0][1] is None  # nothing measured before the first
    for index, (plan, bound) in enumerate(seen[1:], start=1):
        if plan == baseline:
            assert bound is None
            continue
        best_top = max(returned[:index])[1]  # the fastest run before this one
        assert bound == pytest.approx(best_top * 1.055), plan.describe()
    stopped = [t for t in record.trials if (t.reason or "").startswith("stopped after 3")]
    assert stopped  # the made-up machine's ZeRO-3 and accumulation plans are well behind
    for trial in stopped:
        assert trial.outcome == "ok" and trial.step_interval is not None
        assert "the best measured" in (trial.reason or "")
    assert all(t.reason is None for t in record.trials if t.plan == baseline)
