"""The emit stage: a plan becomes a DeepSpeed config (a pure dict builder with autotune's checks)
and the code changes a config cannot carry, per framework. No torch, no DeepSpeed import.
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
    check_config,
    check_plan_kept,
    check_top_level_keys,
    emit_deepspeed_config,
    merge_into_base,
    plan_config,
    plan_readback,
    with_hf_auto,
)

__all__ = [
    "Config",
    "EmittedConfig",
    "FP16_LOSS_SCALING",
    "GRADIENT_CLIPPING",
    "HF_AUTO_KEYS",
    "KNOWN_TOP_LEVEL_KEYS",
    "STAGE3_PERSISTENCE_THRESHOLD",
    "STAGE3_PREFETCH_BUCKET_SIZE",
    "check_config",
    "check_plan_kept",
    "check_top_level_keys",
    "code_changes_for",
    "emit_deepspeed_config",
    "hf_training_arguments",
    "merge_into_base",
    "plan_config",
    "plan_readback",
    "with_hf_auto",
]
