"""An engine's own cost per step: which engine a plan runs, the calibration stack's collectives
(subtracted from what the stack measures), the fit over the stacks' depths and widths, and its
part in a plan's predicted seconds."""

from __future__ import annotations

import pytest

from autotune.estimator import (
    engine_key,
    engine_keys,
    engine_seconds,
    engine_stacks,
    estimate_plan,
    facts_from_profile,
    fit_engine_cost,
    link_measure,
    stack_communication,
    wide_width,
)
from autotune.records import EngineCost, LinkMeasure, LinkPoint, Machine, parse_plan
from tests._profiles import synthetic_profile

LATENCY = 1e-3


def _link(costs: list[EngineCost] | None = None) -> LinkMeasure:
    """A 2-rank link of 1 ms a call whatever the size (bandwidth far above any stack's bytes)."""
    points = [LinkPoint(collective=c, nbytes=size, seconds=LATENCY + size / 1e15,
                        low=LATENCY, high=LATENCY + size / 1e15, repeats=1)
              for c in ("all_reduce", "all_gather", "reduce_scatter")
              for size in (2**16, 2**20)]  # fmt: skip
    measure = link_measure(points, 2, "gloo")
    return measure.model_copy(update={"engine_costs": costs or []})


@pytest.mark.parametrize(
    ("knobs", "key"),
    [
        ("stage=0,nproc_per_node=1", None),  # plain torch: no engine
        ("precision=bf16,stage=0,nproc_per_node=1", "deepspeed-0-bf16"),
        ("stage=0,nproc_per_node=2", "deepspeed-0-fp32"),
        ("precision=amp_bf16,stage=2,nproc_per_node=2", "deepspeed-2-fp32"),  # fp32 weights
        ("precision=fp16,stage=3,nproc_per_node=2", "deepspeed-3-bf16"),
        ("engine=fsdp2,stage=2,nproc_per_node=2", "fsdp2-2-fp32"),
        ("engine=fsdp2,precision=bf16,stage=3,nproc_per_node=2", "fsdp2-3-bf16"),
        ("precision=bf16,stage=2,offload_optimizer=cpu,nproc_per_node=2", None),
    ],
)
def test_each_plan_runs_one_engine(knobs: str, key: str | None) -> None:
    assert engine_key(parse_plan(knobs)) == key


def test_the_engines_of_a_set_of_plans_each_once_in_order() -> None:
    plans = [parse_plan(k) for k in ("stage=3,nproc_per_node=2", "stage=0,nproc_per_node=1",
                                     "stage=3,ga=2,nproc_per_node=2", "stage=0,nproc_per_node=2")]  # fmt: skip
    assert engine_keys(plans) == ["deepspeed-3-fp32", "deepspeed-0-fp32"]


# Per micro-batch and once per step, in calls of 1 ms, as the schedules counted in
# tests/runtime/test_shaped_link.py issue them for a calibration stack of (blocks, matrices per
# block, width): 8x8 matrices are under ZeRO-3's persistence threshold, so one gather stands for
# them all.
@pytest.mark.parametrize(
    ("key", "stack", "micro_calls", "step_calls"),
    [
        ("deepspeed-0-fp32", (4, 1, 8), 0, 1),  # one all-reduce at the boundary
        ("deepspeed-1-fp32", (4, 1, 8), 0, 2),  # ... and the updated parameters' all-gather
        ("deepspeed-2-bf16", (16, 1, 8), 1, 1),  # an all-reduce every micro-batch, then the gather
        ("deepspeed-3-fp32", (16, 1, 8), 2, 0),  # a gather and a reduce-scatter every micro-batch
        # 2048x2048 matrices are above the threshold: each gathered in forward (and kept for
        # backward: 8.4M elements are under DeepSpeed's live-parameter limit), and the gradients
        # reduce-scattered in one bucket
        ("deepspeed-3-fp32", (2, 1, 2048), 2 + 1, 0),
        # 4 blocks and the root: a gather per unit, each block's again in backward, a
        # reduce-scatter per unit, whatever the matrices in a block; no gather again without
        # resharding
        ("fsdp2-3-fp32", (4, 1, 8), 5 + 4 + 5, 0),
        ("fsdp2-3-fp32", (4, 8, 8), 5 + 4 + 5, 0),
        ("fsdp2-2-bf16", (16, 1, 8), 17 + 17, 0),
    ],
)
def test_the_stacks_collectives_are_taken_out(
    key: str, stack: tuple[int, int, int], micro_calls: int, step_calls: int
) -> None:
    micro, step = stack_communication(key, *stack, _link())
    # the bytes add at most 0.1 us at the link's 1e15 bytes/s
    assert micro == pytest.approx(micro_calls * LATENCY, abs=1e-7)
    assert step == pytest.approx(step_calls * LATENCY, abs=1e-7)


def test_deepspeeds_cost_is_the_plane_through_its_three_stacks() -> None:
    # 2 ms at 4 tensors of 64 elements, 8 ms at 16: 0.5 ms a tensor (32 us for the 256
    # elements more, negligible) and nothing fixed; the wide stack's two tensors of 2048^2 take
    # 85 ms: 1 ms for them, 84 ms for their 8,388,608 elements, 10 ns each. The step's 3 ms at all.
    stacks = [(4, 1, 8), (16, 1, 8), (2, 1, 2048)]
    elements = 2 * 2048**2
    per_element = 84e-3 / elements
    micro = [2e-3 + 256 * per_element, 8e-3 + 1024 * per_element, 1e-3 + 84e-3]
    cost = fit_engine_cost("deepspeed-3-fp32", stacks, micro, [3e-3] * 3, steps=4)
    assert cost.micro_per_tensor_s == pytest.approx(5e-4)
    assert cost.micro_per_element_s == pytest.approx(84e-3 / elements)
    assert cost.micro_fixed_s == pytest.approx(0.0, abs=1e-12)
    assert cost.step_per_tensor_s == pytest.approx(0.0, abs=1e-12)
    assert cost.step_per_element_s == pytest.approx(0.0, abs=1e-18)
    assert cost.step_fixed_s == pytest.approx(3e-3)
    assert cost.micro_per_module_s == cost.step_per_module_s == 0.0  # none under DeepSpeed
    assert cost.width == [8, 8, 2048]
    # noise that makes the deeper stack cheaper: no negative slope, the rest fitted again (the
    # wide stack's 2 tensors then cost what the narrow ones do, and its elements the difference)
    noisy = fit_engine_cost("deepspeed-0-fp32", stacks, [1e-3, 5e-4, 1e-3], [0.0] * 3, steps=4)
    assert noisy.micro_per_tensor_s == 0.0
    assert noisy.micro_fixed_s == pytest.approx(7.5e-4, rel=1e-3)
    assert noisy.micro_per_element_s == pytest.approx(2.5e-4 / elements, rel=1e-2)
    with pytest.raises(ValueError, match="3 or more distinct stacks"):
        fit_engine_cost("deepspeed-0-fp32", [(4, 1, 8), (4, 1, 8), (16, 1, 8)], [1e-3] * 3,
                        [0.0] * 3, steps=4)  # fmt: skip


def test_fsdp2s_cost_splits_modules_from_tensors_and_elements() -> None:
    # made from 1 ms fixed + 2 ms a sharded module + 0.25 ms a tensor + 5 ns an element: 4
    # blocks of 1 (5 modules, 4 tensors) 12 ms, 16 of 1 (17, 16) 39 ms, 4 of 8 (5, 32) 19 ms
    # (their elements ~us), 2 of one 2048^2 (3 modules, 2 tensors) 7.5 + 41.9 ms
    stacks = [(4, 1, 8), (16, 1, 8), (2, 1, 2048), (4, 8, 8)]
    tensors, modules = [4, 16, 2, 32], [5, 17, 3, 5]
    elements = [t * w * w for t, (_, _, w) in zip(tensors, stacks, strict=True)]
    micro = [1e-3 + 2e-3 * m + 2.5e-4 * t + 5e-9 * e
             for t, m, e in zip(tensors, modules, elements, strict=True)]  # fmt: skip
    cost = fit_engine_cost("fsdp2-3-fp32", stacks, micro, [0.0] * 4, steps=4)
    assert cost.micro_fixed_s == pytest.approx(1e-3)
    assert cost.micro_per_module_s == pytest.approx(2e-3)
    assert cost.micro_per_tensor_s == pytest.approx(2.5e-4)
    assert cost.micro_per_element_s == pytest.approx(5e-9)
    # tensors that seem to cost less than nothing: the rest fitted again without them
    cheap = [12e-3, 36e-3, 10e-3 + 41.9e-3, 10e-3]
    cost = fit_engine_cost("fsdp2-3-fp32", stacks, cheap, [0.0] * 4, steps=4)
    assert cost.micro_per_tensor_s == 0.0 and cost.micro_per_module_s > 0
    assert cost.micro_per_element_s > 0
    with pytest.raises(ValueError, match="4 or more distinct stacks"):
        fit_engine_cost("fsdp2-3-fp32", stacks[:3], [1e-3, 2e-3, 3e-3], [0.0] * 3, steps=4)


COST = EngineCost(engine="deepspeed-3-bf16", micro_fixed_s=1e-3, micro_per_tensor_s=5e-4,
                  step_fixed_s=2e-3, step_per_tensor_s=1e-4, blocks=[4, 16], per_block=[1, 1],
                  steps=4)  # fmt: skip


def test_a_plan_pays_its_engine_per_micro_batch_and_per_step() -> None:
    plan = parse_plan("precision=bf16,stage=3,mb=1,ga=4,nproc_per_node=2")
    seconds, note = engine_seconds(plan, _link([COST]), sizes=[100] * 10, blocks=2)
    # 4 micro-batches of 1 + 0.5 x 10 ms, and a step of 2 + 0.1 x 10 ms
    assert seconds == pytest.approx(4 * 6e-3 + 3e-3)
    assert note is not None and "27.0 ms per step" in note and "10 parameter tensors" in note
    # ... and, measured per element, 10 ns an element a micro-batch, 1 ns at the step: 1,000
    # elements add 10 us to each micro-batch and 1 us to the step
    by_element = COST.model_copy(update={"micro_per_element_s": 1e-8, "step_per_element_s": 1e-9})
    seconds, note = engine_seconds(plan, _link([by_element]), sizes=[100] * 10, blocks=2)
    assert seconds == pytest.approx(4 * (6e-3 + 1e-5) + 3e-3 + 1e-6)
    assert note is not None and "1,000 elements" in note
    # another engine's cost is not this plan's
    other = parse_plan("precision=bf16,stage=2,mb=1,ga=4,nproc_per_node=2")
    seconds, note = engine_seconds(other, _link([COST]), sizes=[100] * 10, blocks=2)
    assert seconds == 0.0 and note is not None and "not measured" in note


def test_the_estimate_adds_the_engines_cost_to_the_predicted_seconds() -> None:
    facts = facts_from_profile(synthetic_profile(device="cpu", layers=12))
    facts = facts.model_copy(update={"parameter_sizes": (1000,) * 30})
    plan = parse_plan("engine=fsdp2,precision=fp32,stage=3,mb=2,ga=3,nproc_per_node=2")
    # 1 ms a sharded module (12 blocks and the root) and 0.5 ms a tensor a micro-batch, 50 ms a
    # step
    measured = EngineCost(engine="fsdp2-3-fp32", micro_fixed_s=0.0, micro_per_tensor_s=5e-4,
                          micro_per_module_s=1e-3, step_fixed_s=0.05, step_per_tensor_s=0.0,
                          blocks=[4, 16, 4], per_block=[1, 1, 8], steps=4)  # fmt: skip
    machine = Machine(nproc_per_node=2, link=_link())
    without = estimate_plan(facts, plan, machine=machine)
    with_cost = estimate_plan(
        facts, plan, machine=Machine(nproc_per_node=2, link=_link([measured]))
    )
    assert without.predicted_step_seconds is not None
    assert with_cost.predicted_step_seconds == pytest.approx(
        without.predicted_step_seconds + 3 * (13e-3 + 15e-3) + 0.05
    )
    assert any("fsdp2-3-fp32 engine's own work: 134.0 ms" in n for n in with_cost.notes)
    assert any(
        "30 parameter tensors of 30,000 elements, 13 sharded modules" in n for n in with_cost.notes
    )
    assert any("not measured here" in n for n in without.notes)
    # a model whose tensors are not known: not included, and said so
    unknown = facts.model_copy(update={"parameter_sizes": None})
    plain = estimate_plan(unknown, plan, machine=Machine(nproc_per_node=2, link=_link([measured])))
    assert plain.predicted_step_seconds == pytest.approx(without.predicted_step_seconds)
    assert any("parameter tensors are not known" in n for n in plain.notes)


WIDTHS = [(739_456, 1024), (2 * 1024**2, 1024), (2 * 1024**2 + 1, 2048), (123_849_984, 2048),
          (None, 2048)]  # fmt: skip


@pytest.mark.parametrize(("parameters", "width"), WIDTHS)
def test_the_wide_stack_holds_the_models_parameters(parameters: int | None, width: int) -> None:
    # tiny GPT's 739,456 parameters fit two 1024x1024 matrices; one more than they hold, GPT-2
    # small, or a model of unknown size get two 2048x2048 (past a 32 MiB cache in fp32)
    assert wide_width(parameters) == width
    assert engine_stacks("deepspeed-2-fp32", width) == ((4, 1, 8), (16, 1, 8), (2, 1, width))
    assert engine_stacks("fsdp2-3-bf16", width) == (
        (4, 1, 8), (16, 1, 8), (2, 1, width), (4, 8, 8))  # fmt: skip
