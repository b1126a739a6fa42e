"""The deliverable of an ``engine=fsdp2`` plan: ``fully_shard`` code, an Accelerate config, HF Trainer args.

Pure builders, no torch or accelerate import. The mapping (``records.Engine``): stage 3 is
``reshard_after_forward=True``, stage 2 ``False``; ``offload_param=cpu`` is ``CPUOffloadPolicy``;
``precision=bf16`` is ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` with the
fp32 shards as master weights; ``amp_bf16`` is autocast over fp32 shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.records import AutotuneError, Plan

ACCELERATE_REDUCE_NOTE = (
    "Accelerate's config file sets MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16); "
    "for reduce_dtype=fp32 pass the plugin in code (accelerate_code)."
)


@dataclass(frozen=True)
class Fsdp2Deliverable:
    """Everything a user needs to run an FSDP2 plan, in the three forms autotune writes."""

    plan: str
    code: str
    """Plain torch: ``fully_shard`` per block, then the root."""
    accelerate_config: dict[str, Any]
    """An ``accelerate launch --config_file`` YAML/JSON (``distributed_type: FSDP``, ``fsdp_version: 2``)."""
    accelerate_code: str
    """The ``FullyShardedDataParallelPlugin`` that also fixes ``reduce_dtype`` to fp32."""
    hf_trainer: dict[str, Any]
    """``TrainingArguments`` keywords (``fsdp``, ``fsdp_config`` with ``version: 2``)."""
    notes: tuple[str, ...]


def _require_fsdp2(plan: Plan) -> None:
    if plan.engine != "fsdp2":
        raise AutotuneError(f"plan {plan.describe()}: not engine=fsdp2 (a DeepSpeed plan)")


def _policy_lines(plan: Plan) -> tuple[list[str], str]:
    """Policy construction lines and the keyword arguments every call takes."""
    lines, kwargs = [], [f"reshard_after_forward={plan.reshard_after_forward}"]
    if plan.precision == "bf16":
        lines.append(
            "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
        )
        kwargs.append("mp_policy=mp")
    if plan.offload_param == "cpu":
        lines.append("offload = CPUOffloadPolicy()  # pin_memory=False on a CPU-only machine")
        kwargs.append("offload_policy=offload")
    return lines, ", ".join(kwargs)


def fsdp2_code(plan: Plan, block_stack: str = "model.model.layers") -> str:
    """The exact plain-torch lines: ``fully_shard`` on every block of ``block_stack``, then the root.

    The root takes PyTorch's default ``reshard_after_forward`` (not resharded: its
    parameters are needed again as soon as backward starts).
    """
    _require_fsdp2(plan)
    policies, kwargs = _policy_lines(plan)
    root_kwargs = ", ".join(part for part in kwargs.split(", ") if "reshard" not in part)
    lines = [
        "import torch",
        "from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard",
        "",
        "# after torch.distributed.init_process_group(...) and before building the optimizer",
        *policies,
        f"for block in {block_stack}:",
        f"    fully_shard(block, {kwargs})",
        f"fully_shard(model{', ' + root_kwargs if root_kwargs else ''})",
        "optimizer = torch.optim.AdamW(model.parameters())  # on the sharded parameters",
    ]
    if plan.precision == "amp_bf16":
        lines.append("# forward under torch.autocast(device_type, dtype=torch.bfloat16)")
    if plan.checkpoint_blocks:
        lines.append(
            f"# checkpoint the first {plan.checkpoint_blocks} blocks before fully_shard "
            "(torch.utils.checkpoint, non-reentrant)"
        )
    return "\n".join(lines)


def accelerate_fsdp_config(
    plan: Plan, *, world_size: int | None = None, layer_class: str | None = None
) -> dict[str, Any]:
    """The ``accelerate launch`` config file for the plan (keys of ``accelerate config``).

    Args:
        plan: an ``engine=fsdp2`` plan.
        world_size: processes in all; default the plan's gpus x nodes.
        layer_class: the block class to wrap (``TRANSFORMER_BASED_WRAP``); without it
            Accelerate wraps by the model's ``_no_split_modules``.
    """
    _require_fsdp2(plan)
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_reshard_after_forward": plan.reshard_after_forward,
        "fsdp_offload_params": plan.offload_param == "cpu",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False,
        "fsdp_activation_checkpointing": plan.checkpoint_blocks > 0,
    }
    if layer_class:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer_class
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": "bf16" if plan.precision in ("bf16", "amp_bf16") else "no",
        "num_machines": plan.nodes,
        "num_processes": world_size or plan.world_size,
        "machine_rank": 0,
        "use_cpu": False,
        "fsdp_config": fsdp,
    }


def accelerate_plugin_code(plan: Plan) -> str:
    """``Accelerator(fsdp_plugin=...)`` lines carrying the plan's exact policies."""
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
    if plan.checkpoint_blocks:
        args.append("activation_checkpointing=True")
    return "\n".join(
        [
            "import torch",
            "from accelerate import Accelerator, FullyShardedDataParallelPlugin",
            "from torch.distributed.fsdp import MixedPrecisionPolicy",
            f"plugin = FullyShardedDataParallelPlugin({', '.join(args)})",
            "accelerator = Accelerator(fsdp_plugin=plugin)",
        ]
    )


def hf_fsdp2_arguments(plan: Plan, layer_class: str | None = None) -> dict[str, Any]:
    """``TrainingArguments`` keywords for the plan (transformers 5: ``fsdp=True`` and ``fsdp_config``)."""
    _require_fsdp2(plan)
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": plan.reshard_after_forward,
        "cpu_offload": plan.offload_param == "cpu",
        "activation_checkpointing": plan.checkpoint_blocks > 0,
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


def fsdp2_deliverable(
    plan: Plan,
    *,
    world_size: int | None = None,
    block_stack: str = "model.model.layers",
    layer_class: str | None = None,
    trials: bool = True,
) -> Fsdp2Deliverable:
    """All three forms for one plan, with the notes that go beside them."""
    notes = [ACCELERATE_REDUCE_NOTE] if plan.precision == "bf16" else []
    if plan.checkpoint_blocks:
        notes.append(
            "Accelerate and the HF Trainer checkpoint every block; "
            f"the plan checkpoints {plan.checkpoint_blocks} (the code does that)."
        )
    if not trials:
        notes.append("estimate-and-emit only: FSDP2 plans were not run as trials here.")
    return Fsdp2Deliverable(
        plan=plan.describe(),
        code=fsdp2_code(plan, block_stack),
        accelerate_config=accelerate_fsdp_config(
            plan, world_size=world_size, layer_class=layer_class
        ),
        accelerate_code=accelerate_plugin_code(plan),
        hf_trainer=hf_fsdp2_arguments(plan, layer_class),
        notes=tuple(notes),
    )
