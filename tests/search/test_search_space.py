"""The search space: divisors keep the global batch, offload lapses, OOM lessons."""

from __future__ import annotations

import pytest

from autotune.records import AutotuneError, Plan
from autotune.search import divisors
from autotune.search._space import make_space, oom_lesson


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert divisors(7) == [1, 7]


def test_every_plan_keeps_the_global_batch() -> None:
    space = make_space(
        24, 2, 3, Plan(precision="bf16", offload_optimizer="cpu", zero_stage=2), None
    )
    plans = space.all_plans()
    # Two precisions: the policy's, and fp32 for the user's plan that tune() measures as the
    # baseline when none is given.
    assert len(plans) == space.size() == len(divisors(12)) * 4 * 4 * 2
    assert len({p.model_dump_json() for p in plans}) == len(plans)
    assert all(p.global_batch == 24 and p.world_size == 2 for p in plans)
    assert all(p.offload_optimizer == "none" for p in plans if p.zero_stage == 0)
    assert all(p.offload_optimizer == "cpu" for p in plans if p.zero_stage > 0)
    assert {p.precision for p in plans} == {"bf16", "fp32"}


def test_one_rank_searches_no_zero_and_adds_the_baseline_precision() -> None:
    space = make_space(8, 1, 2, Plan(precision="amp_bf16"), Plan(micro_batch=8))
    assert space.zero_stages == [0]
    assert space.precisions == ("amp_bf16", "fp32")
    plan = space.plan({"micro_batch": 2, "checkpoint_blocks": 1, "precision": "fp32"})
    assert (plan.micro_batch, plan.grad_accum, plan.checkpoint_blocks) == (2, 4, 1)
    assert space.plan(space.params(plan)) == plan


@pytest.mark.parametrize(("global_batch", "nproc"), [(0, 1), (8, 0), (9, 2)])
def test_bad_batch_split_is_one_line(global_batch: int, nproc: int) -> None:
    with pytest.raises(AutotuneError, match="--global-batch|--nproc"):
        make_space(global_batch, nproc, 0, None, None)


def test_oom_lesson_only_for_larger_micro_batch_with_same_knobs() -> None:
    failed = Plan(micro_batch=4, grad_accum=2, checkpoint_blocks=1)
    assert oom_lesson(Plan(micro_batch=8, checkpoint_blocks=1), [failed]) == failed
    assert oom_lesson(Plan(micro_batch=4, grad_accum=2, checkpoint_blocks=1), [failed]) == failed
    assert oom_lesson(Plan(micro_batch=2, grad_accum=4, checkpoint_blocks=1), [failed]) is None
    assert oom_lesson(Plan(micro_batch=8, checkpoint_blocks=2), [failed]) is None


def test_a_space_over_nodes_splits_the_batch_over_every_rank_and_searches_zero() -> None:
    space = make_space(16, 1, 0, None, None, nnodes=2)
    assert space.world == 2 and space.micro_batches == [1, 2, 4, 8]
    assert space.zero_stages == [0, 1, 2, 3]
    plan = space.plan({"micro_batch": 4, "zero_stage": 2})
    assert (plan.nnodes, plan.nproc_per_node, plan.grad_accum, plan.global_batch) == (2, 1, 2, 16)
    assert space.params(plan)["zero_stage"] == 2
