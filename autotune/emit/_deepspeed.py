"""The DeepSpeed config emitter: a plan becomes a checked, ready DeepSpeed config dict.

A pure dict builder: DeepSpeed's own validation of the result is the runtime's
(``autotune.runtime.ds_validate``), wired in by ``autotune.api.deepspeed_config``.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from typing import Any

from autotune.estimator import BUCKET_SIZE, STAGE3_PERSISTENCE_THRESHOLD, bucket_elements
from autotune.records import AutotuneError, Capabilities, Plan, Recommendation, parse_plan

Config = dict[str, Any]
PlanLike = Plan | Recommendation | str
"""What a deliverable is made from: a plan, a recommendation (its plan), or a plan string."""

# DeepSpeed's own defaults, written out so the file shows what the engine will use.
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
GRADIENT_CLIPPING = 1.0
FP16_LOSS_SCALING = {
    "loss_scale": 0,  # 0 = dynamic loss scaling
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}

# Keys the HF Trainer fills from TrainingArguments (transformers.integrations.deepspeed
# HfTrainerDeepSpeedConfig.trainer_config_process / _finalize); Accelerate reads the same.
HF_AUTO_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "bf16.enabled",
    "fp16.enabled",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)

# Top-level sections DeepSpeed 0.19 reads; it ignores any other key without a word,
# so a typo in a user's base config would silently lose its setting.
KNOWN_TOP_LEVEL_KEYS = frozenset(
    [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "managed_gradient_accumulation",
        "steps_per_print",
        "dump_state",
        "disable_python_gc",
        "disable_allgather",
        "communication_data_type",
        "seq_parallel_communication_data_type",
        "prescale_gradients",
        "gradient_predivide_factor",
        "gradient_allreduce_op",
        "sparse_gradients",
        "zero_optimization",
        "activation_checkpointing",
        "comms_logger",
        "tensorboard",
        "wandb",
        "csv_monitor",
        "comet",
        "gradient_clipping",
        "fp16",
        "bf16",
        "bfloat16",
        "torch_autocast",
        "optimizer",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "scheduler",
        "flops_profiler",
        "wall_clock_breakdown",
        "memory_breakdown",
        "autotuning",
        "use_data_before_expert_parallelism",
        "hybrid_engine",
        "pipeline",
        "data_efficiency",
        "curriculum_learning",
        "checkpoint",
        "data_types",
        "aio",
        "dataloader_drop_last",
        "log_level",
        "datastates_ckpt",
        "weight_quantization",
        "compile",
        "timers",
        "tensor_parallel",
        "expert_parallel",
        "elasticity",
        "compression_training",
        "sparse_attention",
        "progressive_layer_drop",
        "eigenvalue",
        "quantize_training",
        "nebula",
        "vocabulary_size",
    ]
)


def as_plan(given: object, blocks: int | None = None) -> Plan:
    """The plan a deliverable is made from: a :class:`Plan`, a :class:`Recommendation`'s, or a
    plan string read by :func:`~autotune.records.parse_plan` (``ckpt=all`` is every one of the
    model's ``blocks``, refused where that count is not known).

    Raises:
        AutotuneError: anything else, or a bad plan string; one line.
    """
    if isinstance(given, Plan):
        return given
    if isinstance(given, Recommendation):
        return given.plan
    if isinstance(given, str):
        return parse_plan(given, flag="plan", blocks=blocks)
    raise AutotuneError(
        "plan: takes a Plan, a Recommendation or a plan string such as 'stage=2,mb=4' "
        f"(got {type(given).__name__})"
    )


@dataclass(frozen=True)
class EmittedConfig:
    """A checked config, and the fully resolved form DeepSpeed's own parser should see."""

    config: Config
    """What the user gets (with ``"auto"`` where the HF Trainer fills values, if asked)."""
    resolved: Config
    """Every ``"auto"`` filled from the plan: what ``DeepSpeedConfig`` validates."""
    world_size: int


def emit_deepspeed_config(
    plan_or_recommendation: PlanLike,
    *,
    world_size: int | None = None,
    base: Config | None = None,
    hf_auto: bool = False,
    nvme_path: str | None = None,
    capabilities: Capabilities | None = None,
    parameters: int | None = None,
) -> EmittedConfig:
    """A ready DeepSpeed config for a plan, checked by autotune's rules before it is returned.

    Args:
        plan_or_recommendation: a :class:`~autotune.records.Plan`, a
            :class:`~autotune.records.Recommendation` (its ``plan`` is used), or a plan string
            such as ``"stage=2,mb=4"``.
        world_size: data-parallel ranks the config is for; defaults to the plan's
            ``nproc_per_node x nodes``. ``train_batch_size`` is micro-batch x
            accumulation x this.
        base: a user's existing config. Its keys are kept; a value that contradicts
            the plan (stage, batch sizes, precision, offload) raises, never silently
            overwritten. ``"auto"`` in ``base`` is filled from the plan.
        hf_auto: write ``"auto"`` where the HF Trainer / Accelerate fill values
            themselves (after checking the config with the plan's values).
        nvme_path: where NVMe offload goes; required when the plan offloads to nvme
            (unless ``base`` gives one).
        capabilities: the target device's precision support (from a profile); when
            given, a 16-bit type the device lacks is refused.
        parameters: the model's parameter count; sizes the ZeRO buckets with
            :func:`bucket_elements` (None: the recommendation's, else DeepSpeed's default).

    Returns:
        The config as a JSON-ready dict, with its resolved form for DeepSpeed's parser.

    Raises:
        AutotuneError: one line naming the key at fault, when the config would be
            invalid or contradict the plan.
    """
    plan = as_plan(plan_or_recommendation)
    if plan.engine != "deepspeed":
        raise AutotuneError(
            f"plan {plan.describe()}: engine={plan.engine} has no DeepSpeed config "
            "(its deliverable is fsdp2_config / `autotune config --plan engine=fsdp2,...`)"
        )
    if isinstance(plan_or_recommendation, Recommendation):
        if capabilities is None:
            capabilities = plan_or_recommendation.capabilities
        if parameters is None:
            parameters = plan_or_recommendation.parameters
    world = plan.world_size if world_size is None else world_size
    if world < 1:
        raise AutotuneError(f"world_size: {world} must be at least 1")
    user = copy.deepcopy(base or {})
    check_top_level_keys(user)
    ours = plan_config(
        plan,
        world_size=world,
        nvme_path=nvme_path,
        client_optimizer="optimizer" not in user,
        parameters=parameters,
    )
    merged = merge_into_base(user, ours)
    resolved = _resolve_leftover_auto(merged, hf_auto)
    check_plan_kept(resolved, plan, world)
    check_config(resolved, world_size=world, capabilities=capabilities)
    return EmittedConfig(with_hf_auto(merged) if hf_auto else merged, resolved, world)


def plan_config(
    plan: Plan,
    *,
    world_size: int,
    nvme_path: str | None = None,
    client_optimizer: bool = True,
    parameters: int | None = None,
) -> Config:
    """The config keys a plan decides, with DeepSpeed's tuning defaults written out.

    ``parameters`` (the model's count) sizes the ZeRO buckets; see :func:`bucket_elements`.
    """
    config: Config = {
        "train_batch_size": plan.micro_batch * plan.grad_accum * world_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": GRADIENT_CLIPPING,
        "bf16": {"enabled": plan.precision == "bf16"},
        "fp16": {"enabled": plan.precision == "fp16"},
        "zero_optimization": _zero_section(plan, nvme_path, bucket_elements(parameters)),
    }
    if plan.precision == "fp16":
        config["fp16"].update(FP16_LOSS_SCALING)
    if plan.precision.startswith("amp_"):
        dtype = "bfloat16" if plan.precision == "amp_bf16" else "float16"
        config["torch_autocast"] = {"enabled": True, "dtype": dtype}
    if client_optimizer:
        # A torch optimizer passed to deepspeed.initialize: ZeRO refuses it without this.
        config["zero_allow_untested_optimizer"] = True
        if plan.offload_optimizer != "none":
            config["zero_force_ds_cpu_optimizer"] = False
    return config


def _zero_section(plan: Plan, nvme_path: str | None, bucket: int) -> Config:
    zero: Config = {"stage": plan.zero_stage}
    if plan.zero_stage == 0:
        return zero
    zero.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=bucket)
    if plan.zero_stage < 3:
        zero.update(reduce_scatter=True, allgather_bucket_size=bucket)
    else:
        zero.update(
            stage3_prefetch_bucket_size=STAGE3_PREFETCH_BUCKET_SIZE,
            stage3_param_persistence_threshold=STAGE3_PERSISTENCE_THRESHOLD,
            stage3_gather_16bit_weights_on_model_save=True,
        )
    for key, device in (
        ("offload_optimizer", plan.offload_optimizer),
        ("offload_param", plan.offload_param),
    ):
        if device != "none":
            zero[key] = {"device": device, "pin_memory": True}
            if device == "nvme" and nvme_path:
                zero[key]["nvme_path"] = nvme_path
    return zero


def merge_into_base(base: Config, ours: Config) -> Config:
    """``ours`` merged into ``base``: base's values win, ``"auto"`` in base is filled."""
    merged = copy.deepcopy(base)
    for key, value in ours.items():
        if key not in merged or merged[key] == "auto":
            merged[key] = copy.deepcopy(value)
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge_into_base(merged[key], value)
    return merged


def check_top_level_keys(config: Config) -> None:
    """Refuse top-level keys DeepSpeed would ignore without a word (typos, other tools')."""
    for key in config:
        if key not in KNOWN_TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(key, sorted(KNOWN_TOP_LEVEL_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AutotuneError(
                f"base config: unknown top-level key {key!r}{hint}: DeepSpeed would ignore it"
            )


def plan_readback(config: Config) -> dict[str, Any]:
    """The plan knobs a config actually sets, keyed by the config key that sets them."""
    zero = config.get("zero_optimization") or {}
    bf16 = config.get("bf16", config.get("bfloat16")) or {}
    return {
        "train_micro_batch_size_per_gpu": config.get("train_micro_batch_size_per_gpu"),
        "gradient_accumulation_steps": config.get("gradient_accumulation_steps"),
        "train_batch_size": config.get("train_batch_size"),
        "zero_optimization.stage": zero.get("stage", 0),
        "zero_optimization.offload_optimizer.device": _offload_device(zero, "offload_optimizer"),
        "zero_optimization.offload_param.device": _offload_device(zero, "offload_param"),
        "bf16.enabled": bool(bf16.get("enabled", False)),
        "fp16.enabled": bool((config.get("fp16") or {}).get("enabled", False)),
        "torch_autocast": _autocast_dtype(config),
    }


def _offload_device(zero: Config, key: str) -> str:
    section = zero.get(key) or {}
    return str(section.get("device", "none"))


def _autocast_dtype(config: Config) -> str | None:
    section = config.get("torch_autocast") or {}
    if not section.get("enabled", False):
        return None
    dtype = str(section.get("dtype", "bfloat16"))
    return {
        "bf16": "bfloat16",
        "torch.bfloat16": "bfloat16",
        "fp16": "float16",
        "half": "float16",
        "torch.float16": "float16",
    }.get(dtype, dtype)


def check_plan_kept(config: Config, plan: Plan, world_size: int) -> None:
    """Raise when a merged config no longer does what the plan says (a base conflict)."""
    want = plan_readback(plan_config(plan, world_size=world_size))
    have = plan_readback(config)
    for key, planned in want.items():
        if have[key] != planned:
            raise AutotuneError(
                f"base config: {key} = {_show(have[key])} conflicts with the plan "
                f"({plan.describe()}), which needs {_show(planned)}"
            )


def _show(value: Any) -> str:
    return "absent" if value is None else repr(value)


def check_config(
    config: Config, *, world_size: int, capabilities: Capabilities | None = None
) -> None:
    """The checks DeepSpeed's parser does not make (it accepts these silently).

    Raises:
        AutotuneError: naming the key at fault.
    """
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if not isinstance(stage, int) or not 0 <= stage <= 3:
        raise AutotuneError(f"zero_optimization.stage = {stage!r}: must be 0, 1, 2 or 3")
    if _offload_device(zero, "offload_param") != "none" and stage != 3:
        raise AutotuneError(f"zero_optimization.offload_param needs stage 3 (stage is {stage})")
    if _offload_device(zero, "offload_optimizer") != "none" and stage == 0:
        raise AutotuneError(
            "zero_optimization.offload_optimizer needs stage 1, 2 or 3 (stage is 0)"
        )
    for key in ("offload_optimizer", "offload_param"):
        if _offload_device(zero, key) == "nvme" and not (zero.get(key) or {}).get("nvme_path"):
            raise AutotuneError(
                f"zero_optimization.{key}: device nvme needs nvme_path (pass nvme_path= / --nvme-path)"
            )
    _check_batch(config, world_size)
    _check_precision(config, capabilities)


def _check_batch(config: Config, world_size: int) -> None:
    micro = _positive_int(config, "train_micro_batch_size_per_gpu")
    accum = _positive_int(config, "gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if total != micro * accum * world_size:
        raise AutotuneError(
            f"train_batch_size = {total!r} is not micro-batch x accumulation x world size "
            f"({micro} x {accum} x {world_size} = {micro * accum * world_size})"
        )


def _positive_int(config: Config, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AutotuneError(f"{key} = {value!r}: must be a positive integer")
    return value


def _check_precision(config: Config, capabilities: Capabilities | None) -> None:
    readback = plan_readback(config)
    if readback["bf16.enabled"] and readback["fp16.enabled"]:
        raise AutotuneError("bf16.enabled and fp16.enabled are both true: choose one")
    if capabilities is None:
        return
    wants_fp16 = readback["fp16.enabled"] or readback["torch_autocast"] == "float16"
    wants_bf16 = readback["bf16.enabled"] or readback["torch_autocast"] == "bfloat16"
    if wants_fp16 and not capabilities.fp16_supported:
        raise AutotuneError("fp16: the target device does not support fp16 (use bf16 or fp32)")
    if wants_bf16 and not capabilities.bf16_supported:
        raise AutotuneError("bf16: the target device does not support bf16 (use fp16 or fp32)")


def _resolve_leftover_auto(config: Config, hf_auto: bool) -> Config:
    """Stand-ins for base ``"auto"`` values the plan does not decide, for checking only."""
    resolved = copy.deepcopy(config)
    for path in _auto_paths(resolved):
        if not hf_auto:
            raise AutotuneError(
                f'base config: {path} is "auto", which only the HF Trainer / Accelerate fill: '
                "give a value or use hf_auto (--hf-auto)"
            )
        parent = resolved
        *parents, leaf = path.split(".")
        for name in parents:
            parent = parent[name]
        # The trainer fills these from its own arguments; any valid number checks the rest.
        parent[leaf] = BUCKET_SIZE if "bucket" in leaf or "threshold" in leaf else 1e-3
    return resolved


def _auto_paths(config: Config, prefix: str = "") -> list[str]:
    paths = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if value == "auto":
            paths.append(path)
        elif isinstance(value, dict):
            paths.extend(_auto_paths(value, f"{path}."))
    return paths


def with_hf_auto(config: Config) -> Config:
    """A copy with ``"auto"`` wherever the HF Trainer fills the value itself."""
    out = copy.deepcopy(config)
    for path in HF_AUTO_KEYS:
        *parents, leaf = path.split(".")
        node: Any = out
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node[leaf] = "auto"
    return out
