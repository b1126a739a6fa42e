"""Knobs that do not pay: checkpointing (or a higher ZeRO stage) a plan does not need to fit is
not run; the search tries the plan without it, and never recommends what it did not show to pay.

The made-up memory model below is the reference: the tests judge every plan the search ran
against it, not against the search's own reasoning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _search import run_tune

from autotune.records import Plan
from autotune.search import Prediction, TrialResult, TrialSettings
from autotune.search._knobs import leaner_plan, unpaid_knob
from autotune.search._records import TrialRecord
from autotune.search._runner import FakeRunner
from autotune.search._space import make_space

BLOCKS = 12


def peak(plan: Plan) -> int:
    """DeepSpeed bf16 ZeRO-0 with accumulation: the optimizer step's spike (halved once the
    optimizer states are sharded) sets the peak unless the activations of a large
    micro-batch rise above it; checkpointing only lowers the activations."""
    optimizer = 900 if plan.zero_stage == 0 else 500
    backward = 300 + plan.micro_batch * (150 - 10 * plan.checkpoint_blocks)
    return max(optimizer, backward)


def moment(plan: Plan) -> str:
    optimizer = 900 if plan.zero_stage == 0 else 500
    return "optimizer_step" if peak(plan) == optimizer else "backward"


def step_ratio(plan: Plan) -> float:
    """Predicted step time: recompute costs 3 % a block, a stage its communication."""
    return (
        (1.0 + 0.5 / plan.micro_batch)
        * (1 + 0.03 * plan.checkpoint_blocks)
        * (1 + 0.05 * plan.zero_stage)
    )


def predictor(budget: int, times: bool = True):  # noqa: ANN201 - a Predict
    """The estimate of the made-up model; without ``times``, no step-time model (so nothing
    is skipped as predicted slower, and the sampler draws from the whole space)."""

    def predict(plan: Plan) -> Prediction:
        value = peak(plan)
        ratio = step_ratio(plan) if times else None
        return Prediction(value <= budget, value, "formula", f"peak {value} > {budget}",
                          step_time_ratio=ratio, peak_moment=moment(plan))  # fmt: skip

    return predict


def behaviour(plan: Plan, settings: TrialSettings) -> TrialResult:
    """What the trials measure: the predicted step time, with a machine-like wobble."""
    step = step_ratio(plan) * (1 + 0.01 * (plan.micro_batch % 3))
    return TrialResult(completed_steps=4, samples_per_s=8.0 / step, step_time=step,
                       step_interval=(0.98 * step, 1.02 * step), peak_memory_bytes=[peak(plan)],
                       peak_source="fake", device_memory=settings.device_memory)  # fmt: skip


def _tune(tmp_path: Path, budget: int, policy: Plan, runner: FakeRunner, times: bool = True):  # noqa: ANN202
    return run_tune(
        "model.py", global_batch=8, nproc=2, blocks=BLOCKS, policy=policy,
        baseline=Plan(micro_batch=4, nproc_per_node=2), predict=predictor(budget, times), trials=10,
        settings=TrialSettings(model_file="model.py", device_memory=budget, timeout_s=5),
        runner=runner, storage=str(tmp_path / "s.db"), repeats=3, seed=0,
    )  # fmt: skip


@pytest.mark.parametrize("times", [True, False], ids=["steered", "sampled"])
def test_a_peak_set_by_the_optimizer_step_is_never_recommended_with_checkpointing(
    tmp_path: Path, times: bool
) -> None:
    # The pick: bf16 ckpt=6 mb=2 ga=2 ZeRO-0 on 2 ranks, global batch 8.
    policy = Plan(micro_batch=2, grad_accum=2, checkpoint_blocks=6, nproc_per_node=2)
    assert peak(policy) == peak(policy.with_changes(checkpoint_blocks=0)) == 900
    runner = FakeRunner(behaviour)
    record = _tune(tmp_path, 1000, policy, runner, times)
    # Every plan of micro-batch <= 4 fits without checkpointing: none ran with it.
    assert runner.plans and all(p.checkpoint_blocks == 0 for p in runner.plans)
    first = record.trials[0]
    assert first.role == "policy" and first.plan == policy.with_changes(checkpoint_blocks=0)
    assert any(
        "does not lower the predicted peak (set by optimizer_step)" in n for n in record.notes
    )
    rec = record.recommendation
    assert rec is not None and rec.plan.checkpoint_blocks == 0
    # Checkpointed plans the sampler drew were pruned, their plain twin queued in their place.
    drawn = [t for t in record.trials if t.plan.checkpoint_blocks]
    assert drawn or times  # with no step times to steer by, the sampler draws some
    plain = {t.plan for t in record.trials}
    for trial in drawn:
        assert trial.state == "pruned" and trial.outcome is None
        assert trial.reason is not None and trial.reason.startswith("checkpointing")
        assert trial.plan.with_changes(checkpoint_blocks=0) in plain


def test_checkpointing_runs_where_the_plan_without_it_does_not_fit(tmp_path: Path) -> None:
    # At 800 the optimizer spike of ZeRO-0 (900) never fits; at ZeRO >= 1, micro-batch 4
    # needs a checkpointed block or more, micro-batch 2 and 1 need none.
    runner = FakeRunner(behaviour)
    policy = Plan(micro_batch=4, checkpoint_blocks=8, zero_stage=1, nproc_per_node=2)
    record = _tune(tmp_path, 800, policy, runner)
    assert runner.plans
    for plan in runner.plans:
        assert peak(plan) <= 800
        if plan.checkpoint_blocks:  # the fewest blocks that fit: one fewer does not
            assert peak(plan.with_changes(checkpoint_blocks=plan.checkpoint_blocks - 1)) > 800
    assert record.trials[0].plan == policy.with_changes(checkpoint_blocks=3)
    rec = record.recommendation
    assert rec is not None and peak(rec.plan) <= 800
    if rec.plan.checkpoint_blocks:
        twin = rec.plan.with_changes(checkpoint_blocks=rec.plan.checkpoint_blocks - 1)
        assert peak(twin) > 800


def test_a_measured_oom_of_the_plain_twin_lets_checkpointing_pay() -> None:
    space = make_space(8, 2, BLOCKS, None, None)
    plan = space.plan({"micro_batch": 2, "checkpoint_blocks": 6, "zero_stage": 0})
    predict = predictor(1000)
    assert unpaid_knob(plan, space, predict, []) is not None
    plain = plan.with_changes(checkpoint_blocks=0)
    oom = [TrialRecord(number=0, plan=plain, state="pruned", outcome="oom")]
    unpaid = unpaid_knob(plan, space, predict, oom)
    # The estimate was wrong about the plain plan: one block is the next leaner twin to try.
    assert unpaid is not None and unpaid.twin == plan.with_changes(checkpoint_blocks=1)


@pytest.mark.parametrize(
    ("stage", "fastest_measured", "expected"),
    [
        (2, None, 0),  # stage 0 fits and is predicted faster: the sampler's stage 2 lapses
        (2, 2, 2),  # a stage-2 plan measured fastest: the higher stages are worth running
        (0, None, 0),
    ],
)
def test_a_higher_stage_runs_only_where_it_pays(
    stage: int, fastest_measured: int | None, expected: int
) -> None:
    space = make_space(8, 2, BLOCKS, None, None)
    plan = space.plan({"micro_batch": 2, "checkpoint_blocks": 0, "zero_stage": stage})
    records = []
    if fastest_measured is not None:
        done = space.plan({"micro_batch": 1, "zero_stage": fastest_measured})
        records = [TrialRecord(number=0, plan=done, state="complete", outcome="ok",
                               samples_per_s=9.0)]  # fmt: skip
    leaner, why = leaner_plan(plan, space, predictor(1000), records)
    assert leaner.zero_stage == expected and leaner.micro_batch == plan.micro_batch
    assert leaner.grad_accum == plan.grad_accum  # the global batch is kept
    assert (why is None) == (expected == stage)
    # The predicted front and the policy keep their stage.
    assert leaner_plan(plan, space, predictor(1000), records, stages=False)[0] == plan
