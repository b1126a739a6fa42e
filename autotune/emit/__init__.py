"""The emit stage: a plan becomes a DeepSpeed config (a pure dict builder with autotune's checks)
and the code changes a config cannot carry, per framework; an ``engine=fsdp2`` plan becomes
``fully_shard`` code, an Accelerate FSDP2 config and HF Trainer arguments. No torch, no DeepSpeed import.
"""

from __future__ import annotations

from autotune.emit._changes import code_changes_for, hf_training_arguments
from autotune.emit._deepspeed import (
    FP16_LOSS_SCALING,
    GRADIENT_CLIPPING,
    HF_AUTO_KEYS,
    KNOWN_TOP_LEVEL_KEYS,
    STAGE3_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_BUCKET_SIZE,
    Config,
    EmittedConfig,
    PlanLike,
    as_plan,
    check_config,
    check_plan_kept,
    check_top_level_keys,
    emit_deepspeed_config,
    merge_into_base,
    plan_config,
    plan_readback,
    with_hf_auto,
)
from autotune.emit._fsdp import (
    DEFAULT_BLOCK_STACK,
    Fsdp2Deliverable,
    accelerate_fsdp_config,
    accelerate_fsdp_yaml,
    accelerate_plugin_code,
    block_stack_expression,
    fsdp2_code,
    fsdp2_deliverable,
    hf_fsdp2_arguments,
)

__all__ = [
    "Config",
    "DEFAULT_BLOCK_STACK",
    "EmittedConfig",
    "FP16_LOSS_SCALING",
    "Fsdp2Deliverable",
    "GRADIENT_CLIPPING",
    "HF_AUTO_KEYS",
    "KNOWN_TOP_LEVEL_KEYS",
    "PlanLike",
    "STAGE3_PERSISTENCE_THRESHOLD",
    "STAGE3_PREFETCH_BUCKET_SIZE",
    "accelerate_fsdp_config",
    "accelerate_fsdp_yaml",
    "accelerate_plugin_code",
    "as_plan",
    "block_stack_expression",
    "check_config",
    "check_plan_kept",
    "check_top_level_keys",
    "code_changes_for",
    "emit_deepspeed_config",
    "fsdp2_code",
    "fsdp2_deliverable",
    "hf_fsdp2_arguments",
    "hf_training_arguments",
    "merge_into_base",
    "plan_config",
    "plan_readback",
    "with_hf_auto",
]
