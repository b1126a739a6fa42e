"""Plan strings: parsed, described and parsed back; the batch arithmetic; one-line refusals."""

from __future__ import annotations

import pytest

from autotune.records import AutotuneError, Plan, format_plan, fsdp2_equivalent, parse_plan

CASES = [
    "mb=4,ga=2",
    "stage=2,mb=2,ga=4,precision=bf16,nproc_per_node=8",
    "stage=3,mb=1,ckpt=12,precision=bf16,nproc_per_node=8,nnodes=2",
    "engine=fsdp2,stage=3,precision=bf16,nproc_per_node=4",
]


@pytest.mark.parametrize("text", CASES)
def test_describe_parses_back_to_the_same_plan(text: str) -> None:
    plan = parse_plan(text)
    assert parse_plan(plan.describe()) == plan
    assert parse_plan(format_plan(plan)) == plan


def test_global_batch_is_micro_batch_times_accumulation_times_ranks() -> None:
    plan = parse_plan("mb=3,ga=5,nproc_per_node=4,nnodes=2")
    assert (plan.world_size, plan.global_batch) == (8, 3 * 5 * 8)


@pytest.mark.parametrize(
    ("text", "named"),
    [("speed=11", "speed"), ("stage=9", "stage"), ("mb=0", "mb"), ("mb", "mb")],
)
def test_a_bad_plan_string_is_one_line_naming_the_flag_and_knob(text: str, named: str) -> None:
    with pytest.raises(AutotuneError) as caught:
        parse_plan(text, flag="--baseline")
    message = str(caught.value)
    assert message.startswith("--baseline") and named in message and "\n" not in message


def test_fsdp2_equivalent_keeps_the_sharding_and_the_batch() -> None:
    zero3 = parse_plan("stage=3,mb=2,ga=2,precision=bf16,nproc_per_node=8")
    fsdp = fsdp2_equivalent(zero3)
    assert fsdp is not None and fsdp.engine == "fsdp2"
    assert (fsdp.zero_stage, fsdp.global_batch) == (3, zero3.global_batch)
    assert fsdp2_equivalent(Plan()) is None  # nothing sharded: no FSDP2 counterpart
