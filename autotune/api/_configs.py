"""The deliverables from Python: a DeepSpeed config checked by DeepSpeed itself, and the FSDP2
code of an ``engine=fsdp2`` plan."""

from __future__ import annotations

from typing import Any

from autotune.emit import Config, PlanLike, as_plan, emit_deepspeed_config
from autotune.records import Capabilities


def deepspeed_config(
    plan_or_recommendation: PlanLike,
    *,
    world_size: int | None = None,
    base: Config | None = None,
    hf_auto: bool = False,
    nvme_path: str | None = None,
    capabilities: Capabilities | None = None,
    parameters: int | None = None,
) -> Config:
    """A ready DeepSpeed config for a plan, checked by autotune and by DeepSpeed itself.

    Takes the arguments of :func:`autotune.emit.emit_deepspeed_config` (a plan, a
    recommendation or a plan string such as ``"stage=2,mb=4"``); when DeepSpeed is installed
    its own ``DeepSpeedConfig`` validates the result at ``world_size``.

    Example:
        >>> from autotune import Plan, deepspeed_config
        >>> cfg = deepspeed_config(Plan(zero_stage=2, micro_batch=4, grad_accum=2, precision="bf16"),
        ...                        world_size=8)
        >>> cfg["train_batch_size"], cfg["zero_optimization"]["stage"], cfg["bf16"]["enabled"]
        (64, 2, True)
    """
    from autotune.runtime.ds_validate import validate_with_deepspeed

    emitted = emit_deepspeed_config(
        plan_or_recommendation, world_size=world_size, base=base, hf_auto=hf_auto,
        nvme_path=nvme_path, capabilities=capabilities, parameters=parameters,
    )  # fmt: skip
    validate_with_deepspeed(emitted.resolved, world_size=emitted.world_size)
    return emitted.config


def fsdp2_config(
    plan_or_recommendation: PlanLike,
    *,
    world_size: int | None = None,
    block_stack: str | None = None,
    layer_class: str | None = None,
    num_blocks: int | None = None,
) -> dict[str, Any]:
    """The FSDP2 deliverable of an ``engine=fsdp2`` plan, as a JSON-ready dict.

    Keys: ``plan``, ``block_stack`` and ``block_stack_from_model``, ``code`` (checkpointing
    of the plan's K blocks, ``fully_shard`` per block, then the root), ``accelerate_config``
    (``accelerate launch --config_file``), ``accelerate_code`` (the plugin with
    ``reduce_dtype=fp32``), ``hf_trainer`` (``TrainingArguments`` keywords), ``notes``.

    Args:
        plan_or_recommendation: an ``engine=fsdp2`` plan, a recommendation of one, or a plan
            string such as ``"engine=fsdp2,stage=3"``.
        world_size: processes in all; default the plan's nproc_per_node x nnodes.
        block_stack: Python for the model's blocks, e.g. ``"model.model.layers"``
            (``emit.block_stack_expression`` of a profile's ``model.block_stack.path``);
            ``None`` uses that default and says so in the code and the notes.
        layer_class: the block class name, for Accelerate's and the Trainer's wrapping.
        num_blocks: L; Accelerate's and the Trainer's checkpointing switch is set only
            when the plan checkpoints all L blocks.

    Example:
        >>> from autotune import fsdp2_config
        >>> from autotune.records import parse_plan
        >>> out = fsdp2_config(parse_plan("engine=fsdp2,stage=3,precision=bf16,nproc_per_node=8"))
        >>> out["accelerate_config"]["fsdp_config"]["fsdp_version"], out["hf_trainer"]["fsdp"]
        (2, True)
    """
    from dataclasses import asdict

    from autotune.emit import fsdp2_deliverable

    deliverable = fsdp2_deliverable(
        as_plan(plan_or_recommendation, blocks=num_blocks),
        world_size=world_size,
        block_stack=block_stack,
        layer_class=layer_class,
        num_blocks=num_blocks,
    )
    return asdict(deliverable)
