"""What an engine's own code adds to a step: DeepSpeed's hooks and bookkeeping, FSDP2's
per-module hooks. Neither a profile (plain torch) nor the collectives' count sees it, and on a
small model it is most of the difference between them and a measured step: on tiny Llama,
ZeRO-3's step took twice what its compute and collectives predict.

It is measured on the ranks themselves (``autotune.runtime.trial.engine_cost``): each engine runs a
stack of one-matrix blocks at two depths, and what its micro-batches and its optimizer step take
beyond the stack's own compute and the collectives :mod:`._comm` times is fitted as ``fixed +
per_unit * units``. A unit is what the engine's hooks are per: a parameter tensor under
DeepSpeed, a sharded module (each block of the stack, and the root) under FSDP2. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.estimator import _costmodel as cm
from autotune.estimator._comm import collective_seconds, measured_link, step_calls
from autotune.records import EngineCost, LinkMeasure, Plan

STACK_WIDTH = 8
"""The calibration stack's blocks: one bias-free ``STACK_WIDTH`` x ``STACK_WIDTH`` matrix each,
so compute and bytes are negligible and the engine's own work is what is left."""


def engine_key(plan: Plan) -> str | None:
    """The engine a trial of ``plan`` runs, as its measured cost is kept: ``deepspeed-<stage>-
    <fp32|bf16>`` or ``fsdp2-<2|3>-<fp32|bf16>`` (16-bit weights: bf16's path, fp16's too;
    autocast keeps fp32 weights); ``None`` for a plain torch step (one rank, no DeepSpeed
    feature) or an offloaded plan (the engine's host path is timed by its own figures)."""
    if plan.offload_optimizer != "none" or plan.offload_param != "none":
        return None
    width = "bf16" if plan.precision in ("bf16", "fp16") else "fp32"
    if plan.engine == "fsdp2":
        return f"fsdp2-{3 if plan.reshard_after_forward else 2}-{width}"
    if plan.uses_deepspeed or plan.world_size > 1:
        return f"deepspeed-{plan.zero_stage}-{width}"
    return None


def engine_keys(plans: Sequence[Plan]) -> list[str]:
    """The engines ``plans`` run, each once, in order."""
    return list(dict.fromkeys(key for key in map(engine_key, plans) if key is not None))


def engine_units(plan: Plan, tensors: int | None, blocks: int) -> int | None:
    """The units an engine's cost grows with for a model of ``tensors`` parameter tensors and
    ``blocks`` blocks: the tensors under DeepSpeed (``None`` where unknown), the sharded
    modules (the blocks and the root) under FSDP2."""
    if plan.engine == "fsdp2":
        return blocks + 1
    return tensors


def stack_plan(key: str, world_size: int, grad_accum: int) -> Plan:
    """The plan the calibration runs the engine ``key`` as, at micro-batch 1."""
    engine, stage, width = key.split("-")
    return Plan(precision=width, micro_batch=1, grad_accum=grad_accum, zero_stage=int(stage),
                engine=engine, nproc_per_node=world_size)  # type: ignore[arg-type]  # fmt: skip


def stack_communication(key: str, units: int, link: LinkMeasure) -> tuple[float, float]:
    """Seconds of collectives the time model counts for the calibration stack of ``units``
    blocks under ``key`` on ``link``: per micro-batch, and once per optimizer step."""
    blocks = units - 1 if key.startswith("fsdp2") else units
    size = STACK_WIDTH * STACK_WIDTH

    def seconds(grad_accum: int) -> float:
        plan = stack_plan(key, link.world_size, grad_accum)
        calls = step_calls(plan, blocks * size, [size] * blocks, blocks=blocks,
                           block_parameters=size)  # fmt: skip
        width = cm.communicated_bytes_per_element(plan.precision)
        return collective_seconds(calls, link.world_size, width, measured_link(link))

    one, two = seconds(1), seconds(2)
    return two - one, 2 * one - two


def fit_engine_cost(
    key: str, units: Sequence[int], micro: Sequence[float], step: Sequence[float], steps: int
) -> EngineCost:
    """The line through each depth's seconds (``micro``: per micro-batch, ``step``: the
    boundary's extra), least squares over the depths; a slope below zero (noise) is taken as 0
    and the fixed part as the mean.

    Raises:
        ValueError: fewer than two distinct depths.
    """
    if len(set(units)) < 2:
        raise ValueError("an engine's cost needs the stack at two or more depths")
    return EngineCost(engine=key, units=list(units), steps=steps,
                      **dict(zip(("micro_fixed_s", "micro_per_unit_s"), _line(units, micro),
                                 strict=True)),
                      **dict(zip(("step_fixed_s", "step_per_unit_s"), _line(units, step),
                                 strict=True)))  # fmt: skip


def _line(xs: Sequence[int], ys: Sequence[float]) -> tuple[float, float]:
    """Intercept and slope of ``ys`` on ``xs`` by least squares, the slope kept at 0 or above."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope < 0:
        return mean_y, 0.0
    return mean_y - slope * mean_x, slope


def engine_seconds(
    plan: Plan, link: LinkMeasure | None, tensors: int | None, blocks: int
) -> tuple[float, str | None]:
    """What the plan's engine adds to its step, and the note that says so: ``grad_accum``
    micro-batches and one optimizer step of the measured cost at the model's units; 0 with
    why, where the plan runs no engine, or nothing measured it."""
    key = engine_key(plan)
    if key is None:
        return 0.0, None
    cost = link.engine_cost(key) if link is not None else None
    units = engine_units(plan, tensors, blocks)
    if cost is None or units is None:
        return 0.0, f"the {key} engine's own per-step cost not included: not measured here"
    micro = max(cost.micro_fixed_s + cost.micro_per_unit_s * units, 0.0)
    boundary = max(cost.step_fixed_s + cost.step_per_unit_s * units, 0.0)
    total = plan.grad_accum * micro + boundary
    what = "parameter tensors" if plan.engine == "deepspeed" else "sharded modules"
    return total, (
        f"the {key} engine's own work: {total * 1e3:.1f} ms per step ({plan.grad_accum} x "
        f"{micro * 1e3:.2f} ms per micro-batch + {boundary * 1e3:.2f} ms per optimizer step at "
        f"{units} {what}), as measured on these ranks beyond the compute and the collectives "
        "counted here"
    )
