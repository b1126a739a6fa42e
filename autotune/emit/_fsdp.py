"""The deliverable of an ``engine=fsdp2`` plan: ``fully_shard`` code, an Accelerate config, HF Trainer args.

Pure builders, no torch or accelerate import. The mapping (``records.Engine``): stage 3 is
``reshard_after_forward=True``, stage 2 ``False``; ``offload_param=cpu`` is ``CPUOffloadPolicy``;
``precision=bf16`` is ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` with the
fp32 shards as master weights; ``amp_bf16`` is autocast over fp32 shards. The plan's
``checkpoint_blocks`` K checkpoints the first K blocks of the stack, as the trials did
(``runtime._blocks.apply_checkpointing``), before ``fully_shard``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.records import AutotuneError, Plan

ACCELERATE_REDUCE_NOTE = (
    "Accelerate's config file sets MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16); "
    "for reduce_dtype=fp32 pass the plugin in code (accelerate_code)."
)
DEFAULT_BLOCK_STACK = "model.model.layers"
"""Where a transformers decoder keeps its blocks; used, and said, when the model is not known."""


@dataclass(frozen=True)
class Fsdp2Deliverable:
    """Everything a user needs to run an FSDP2 plan, in the three forms autotune writes."""

    plan: str
    block_stack: str
    """The Python expression for the model's blocks, e.g. ``model.model.layers``."""
    block_stack_from_model: bool
    """Whether ``block_stack`` was read from the model (its profile), not the default."""
    code: str
    """Plain torch: checkpointing of the plan's K blocks, ``fully_shard`` per block, then the root."""
    accelerate_config: dict[str, Any]
    """An ``accelerate launch --config_file`` YAML (``distributed_type: FSDP``, ``fsdp_version: 2``)."""
    accelerate_code: str
    """The ``FullyShardedDataParallelPlugin`` that also fixes ``reduce_dtype`` to fp32."""
    hf_trainer: dict[str, Any]
    """``TrainingArguments`` keywords (``fsdp``, ``fsdp_config`` with ``version: 2``)."""
    notes: tuple[str, ...]


def block_stack_expression(path: str) -> str:
    """Python for the block stack at ``path``, a dotted name inside ``model`` (a profile's)."""
    if all(part.isidentifier() for part in path.split(".")):
        return f"model.{path}"
    return f"model.get_submodule({path!r})"  # e.g. "encoder.0.layers"


def _require_fsdp2(plan: Plan) -> None:
    if plan.engine != "fsdp2":
        raise AutotuneError(f"plan {plan.describe()}: not engine=fsdp2 (a DeepSpeed plan)")


def _checkpoints_all(plan: Plan, num_blocks: int | None) -> bool:
    """Whether the frameworks' one switch (every block) is the plan's checkpointing."""
    return plan.checkpoint_blocks > 0 and plan.checkpoint_blocks == num_blocks


def _policy_lines(plan: Plan) -> tuple[list[str], str]:
    """Policy construction lines and the keyword arguments every call takes."""
    lines, kwargs = [], [f"reshard_after_forward={plan.reshard_after_forward}"]
    if plan.precision == "bf16":
        lines.append(
            "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
        )
        kwargs.append("mp_policy=mp")
    if plan.offload_param == "cpu":
        lines.append("offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())")
        kwargs.append("offload_policy=offload")
    return lines, ", ".join(kwargs)


_CHECKPOINT_IMPORTS = ["import functools", "", "from torch.utils.checkpoint import checkpoint"]


def _stack_lines(plan: Plan, block_stack: str | None) -> list[str]:
    """``blocks = ...`` and, for K > 0, the checkpointing of the first K blocks."""
    stack = (
        f"blocks = {block_stack}"
        if block_stack
        else f"blocks = {DEFAULT_BLOCK_STACK}  # a default, not read from your model: "
        "set your nn.ModuleList of blocks"
    )
    k = plan.checkpoint_blocks
    if not k:
        return [stack]
    return [
        stack,
        f"# activation checkpointing of blocks 0-{k - 1} (non-reentrant), before sharding",
        f"for block in blocks[:{k}]:",
        "    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)",
    ]


def fsdp2_code(plan: Plan, block_stack: str | None = None) -> str:
    """The exact plain-torch lines: checkpoint the plan's K blocks, ``fully_shard`` on every
    block of ``block_stack``, then the root.

    Args:
        plan: an ``engine=fsdp2`` plan.
        block_stack: Python for the model's blocks (see :func:`block_stack_expression`);
            ``None`` writes :data:`DEFAULT_BLOCK_STACK` with a comment saying it is a default.

    The root takes PyTorch's default ``reshard_after_forward`` (not resharded: its
    parameters are needed again as soon as backward starts).
    """
    _require_fsdp2(plan)
    policies, kwargs = _policy_lines(plan)
    root_kwargs = ", ".join(part for part in kwargs.split(", ") if "reshard" not in part)
    lines = [
        *(_CHECKPOINT_IMPORTS[:2] if plan.checkpoint_blocks else []),
        "import torch",
        "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard",
        *(_CHECKPOINT_IMPORTS[2:] if plan.checkpoint_blocks else []),
        "",
        "# after torch.distributed.init_process_group(...) and before building the optimizer",
        *_stack_lines(plan, block_stack),
        *policies,
        "for block in blocks:",
        f"    fully_shard(block, {kwargs})",
        f"fully_shard(model{', ' + root_kwargs if root_kwargs else ''})",
        "optimizer = torch.optim.AdamW(model.parameters())  # on the sharded parameters",
    ]
    if plan.precision == "amp_bf16":
        lines.append("# forward under torch.autocast(device_type, dtype=torch.bfloat16)")
    return "\n".join(lines)


def accelerate_fsdp_config(
    plan: Plan,
    *,
    world_size: int | None = None,
    layer_class: str | None = None,
    num_blocks: int | None = None,
) -> dict[str, Any]:
    """The ``accelerate launch`` config file for the plan (keys of ``accelerate config``).

    Args:
        plan: an ``engine=fsdp2`` plan.
        world_size: processes in all; default the plan's nproc_per_node x nnodes.
        layer_class: the block class to wrap (``TRANSFORMER_BASED_WRAP``); without it
            Accelerate wraps by the model's ``_no_split_modules``.
        num_blocks: L. Accelerate's ``fsdp_activation_checkpointing`` checkpoints every
            block, so it is on only when the plan checkpoints all L; fewer are done in code.
    """
    _require_fsdp2(plan)
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_reshard_after_forward": plan.reshard_after_forward,
        "fsdp_offload_params": plan.offload_param == "cpu",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_activation_checkpointing": _checkpoints_all(plan, num_blocks),
    }
    if layer_class:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer_class
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": "bf16" if plan.precision in ("bf16", "amp_bf16") else "no",
        "num_machines": plan.nnodes,
        "num_processes": world_size or plan.world_size,
        "machine_rank": 0,
        "use_cpu": False,
        "fsdp_config": fsdp,
    }


def accelerate_fsdp_yaml(config: dict[str, Any]) -> str:
    """The Accelerate config as the YAML file ``accelerate launch --config_file`` reads."""
    import yaml

    return str(yaml.safe_dump(config, sort_keys=False))


def accelerate_plugin_code(
    plan: Plan, block_stack: str | None = None, num_blocks: int | None = None
) -> str:
    """``Accelerator(fsdp_plugin=...)`` lines carrying the plan's exact policies.

    Checkpointing of fewer than L blocks is applied in code before ``accelerator.prepare``
    (the plugin's switch checkpoints every block).
    """
    _require_fsdp2(plan)
    args = [
        "fsdp_version=2",
        f"reshard_after_forward={plan.reshard_after_forward}",
        f"cpu_offload={plan.offload_param == 'cpu'}",
    ]
    if plan.precision == "bf16":
        args.append(
            "mixed_precision_policy=MixedPrecisionPolicy("
            "param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
        )
    everything = _checkpoints_all(plan, num_blocks)
    if everything:
        args.append("activation_checkpointing=True")
    partial = plan.checkpoint_blocks > 0 and not everything
    lines = [
        *(_CHECKPOINT_IMPORTS[:2] if partial else []),
        "import torch",
        "from accelerate import Accelerator, FullyShardedDataParallelPlugin",
        "from torch.distributed.fsdp import MixedPrecisionPolicy",
        *(_CHECKPOINT_IMPORTS[2:] if partial else []),
        "",
        f"plugin = FullyShardedDataParallelPlugin({', '.join(args)})",
        "accelerator = Accelerator(fsdp_plugin=plugin)",
    ]
    if partial:
        lines += ["", *_stack_lines(plan, block_stack), "# then accelerator.prepare(model, ...)"]
    return "\n".join(lines)


def hf_fsdp2_arguments(
    plan: Plan, layer_class: str | None = None, num_blocks: int | None = None
) -> dict[str, Any]:
    """``TrainingArguments`` keywords for the plan (transformers 5: ``fsdp=True`` and ``fsdp_config``).

    ``activation_checkpointing`` checkpoints every block: on only when the plan's K is L.
    """
    _require_fsdp2(plan)
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": plan.reshard_after_forward,
        "cpu_offload": plan.offload_param == "cpu",
        "activation_checkpointing": _checkpoints_all(plan, num_blocks),
    }
    if layer_class:
        config["transformer_layer_cls_to_wrap"] = [layer_class]
    args: dict[str, Any] = {
        "fsdp": True,
        "fsdp_config": config,
        "per_device_train_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
    }
    if plan.precision in ("bf16", "amp_bf16"):
        args["bf16"] = True
    return args


def _notes(plan: Plan, block_stack: str | None, num_blocks: int | None, trials: bool) -> list[str]:
    notes = [ACCELERATE_REDUCE_NOTE] if plan.precision == "bf16" else []
    if block_stack is None:
        notes.append(
            f"block stack: {DEFAULT_BLOCK_STACK} is a default (a transformers decoder), not read "
            "from your model; give the model's profile (autotune config --profile) to read it."
        )
    k = plan.checkpoint_blocks
    if k and not _checkpoints_all(plan, num_blocks):
        of = f"{k} of {num_blocks}" if num_blocks else f"the first {k}"
        notes.append(
            f"the plan checkpoints {of} blocks; Accelerate's and the HF Trainer's switch "
            "checkpoints every block, so it is off in their configs: run the code's "
            "checkpointing lines on the model before accelerator.prepare or Trainer(...)."
        )
    if not trials:
        notes.append("estimate-and-emit only: FSDP2 plans were not run as trials here.")
    return notes


def fsdp2_deliverable(
    plan: Plan,
    *,
    world_size: int | None = None,
    block_stack: str | None = None,
    layer_class: str | None = None,
    num_blocks: int | None = None,
    trials: bool = True,
) -> Fsdp2Deliverable:
    """All three forms for one plan, with the notes that go beside them.

    Args:
        plan: an ``engine=fsdp2`` plan.
        world_size: processes in all; default the plan's nproc_per_node x nnodes.
        block_stack: Python for the model's blocks (:func:`block_stack_expression` of a
            profile's path); ``None``: :data:`DEFAULT_BLOCK_STACK`, said in the code and notes.
        layer_class: the block class, for Accelerate's and the Trainer's wrapping.
        num_blocks: L, so the frameworks' every-block switch is set when K is L.
        trials: whether FSDP2 plans ran as trials (a note when not).
    """
    _require_fsdp2(plan)
    if num_blocks is not None and plan.checkpoint_blocks > num_blocks:
        raise AutotuneError(
            f"plan {plan.describe()}: checkpoints {plan.checkpoint_blocks} blocks, "
            f"the model has {num_blocks}"
        )
    return Fsdp2Deliverable(
        plan=plan.describe(),
        block_stack=block_stack or DEFAULT_BLOCK_STACK,
        block_stack_from_model=block_stack is not None,
        code=fsdp2_code(plan, block_stack),
        accelerate_config=accelerate_fsdp_config(
            plan, world_size=world_size, layer_class=layer_class, num_blocks=num_blocks
        ),
        accelerate_code=accelerate_plugin_code(plan, block_stack, num_blocks),
        hf_trainer=hf_fsdp2_arguments(plan, layer_class, num_blocks),
        notes=tuple(_notes(plan, block_stack, num_blocks, trials)),
    )
