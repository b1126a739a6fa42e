"""Actions: small pure functions from facts to plan-knob changes, looked up by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autotune.policy._facts import Facts
from autotune.records import Plan

Params = Mapping[str, object]
Changes = dict[str, object]


@dataclass(frozen=True)
class Action:
    """A named change: the knobs it may set, its parameters with defaults, and the function."""

    knobs: frozenset[str]
    fn: Callable[[Facts, Params], Changes]
    defaults: Mapping[str, object] = field(default_factory=dict)
    choices: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    uses: tuple[str, ...] = ()
    """Facts the function reads besides the rule's clauses (shown as evidence too)."""


def _input_pipeline(facts: Facts, params: Params) -> Changes:
    workers = params["workers"]
    assert isinstance(workers, int)
    changes: Changes = {"dataloader_workers": max(workers, facts.plan.dataloader_workers)}
    # Pinned host memory only speeds copies to an accelerator; on CPU it costs time.
    if params["pin_memory"] and facts.device_type == "cuda":
        changes["pin_memory"] = True
    return changes


def _mixed_precision(facts: Facts, params: Params) -> Changes:
    if facts.fast_bf16:
        return {"precision": "amp_bf16"}
    if facts.fp16_supported and facts.device_type == "cuda":
        return {"precision": "amp_fp16"}  # autocast fp16 comes with a GradScaler
    if facts.bf16_supported:
        return {"precision": "amp_bf16"}  # slow here: the condition only lets memory need it
    return {}


def _fused_attention(facts: Facts, params: Params) -> Changes:
    if facts.flash_attn_available and facts.device_type == "cuda":
        return {"attention": "flash_attention_2"}
    return {"attention": "sdpa"} if facts.sdpa_available else {}


def _compile(facts: Facts, params: Params) -> Changes:
    return {"compile": True}


def _checkpoint(facts: Facts, params: Params) -> Changes:
    """To fit (the fewest blocks), or for a larger micro-batch predicted faster; never else.

    Recomputation alone only costs time (METHOD.md section 5).
    """
    if facts.block_count is None:
        return {}
    if facts.fits is False:
        if facts.checkpoint_blocks_to_fit is not None:
            return {"checkpoint_blocks": facts.checkpoint_blocks_to_fit}
        # Nothing fits even so: every block is the most the knob can save; sharding follows.
        share = facts.activation_share
        if share is not None and share >= float(params["all_blocks_above_share"]):  # type: ignore[arg-type]
            return {"checkpoint_blocks": facts.block_count}
        return {}
    micro, blocks = facts.checkpoint_micro_batch, facts.checkpoint_micro_batch_blocks
    if facts.fits and micro is not None and blocks:
        samples = per_rank_batch(facts.target_global_batch, facts.plan)
        if samples % micro:  # the samples per step are never changed to checkpoint
            return {}
        return {"checkpoint_blocks": blocks, "micro_batch": micro,
                "grad_accum": samples // micro}  # fmt: skip
    return {}


def per_rank_batch(target: int | None, plan: Plan) -> int:
    """Samples per rank per optimizer step: the target global batch over the ranks, else
    the plan's micro-batch x accumulation.

    A target that does not split evenly over the ranks gets the nearest whole number (halves
    up, at least 1): the global batch cannot be kept, and the advisor notes it.
    """
    if not target:
        return plan.micro_batch * plan.grad_accum
    return max(1, (2 * target + plan.world_size) // (2 * plan.world_size))


def largest_divisor(samples: int, cap: int) -> int:
    """The largest micro-batch <= ``cap`` (at least 1) that divides ``samples``."""
    return max(m for m in range(1, max(1, min(cap, samples)) + 1) if samples % m == 0)


def _keep_global_batch(facts: Facts, params: Params) -> Changes:
    """micro_batch x grad_accum = the per-rank share of the global batch, exactly.

    The micro-batch is the largest divisor of that share that fits with its accumulation;
    without that fact, the largest divisor <= the micro-batch that fits (or the plan's).
    """
    plan = facts.plan
    samples = per_rank_batch(facts.target_global_batch, plan)
    micro = facts.micro_batch_for_global_batch
    if micro is None or samples % micro:
        cap = plan.micro_batch
        if facts.fits is False and facts.micro_batch_to_fit is not None:
            cap = facts.micro_batch_to_fit
        micro = largest_divisor(samples, cap)
    return {"micro_batch": micro, "grad_accum": samples // micro}


def _zero(facts: Facts, params: Params) -> Changes:
    stage = params["stage"]
    assert isinstance(stage, int)
    changes: Changes = {"zero_stage": max(stage, facts.plan.zero_stage)}
    # ZeRO partitions DeepSpeed's 16-bit weights + fp32 master, not autocast's copies.
    if facts.plan.precision.startswith("amp_"):
        changes["precision"] = facts.plan.precision.removeprefix("amp_")
    return changes


def _offload_optimizer(facts: Facts, params: Params) -> Changes:
    # ZeRO-Offload keeps the optimizer step on the host, so it needs stage >= 2.
    return {"offload_optimizer": params["device"], "zero_stage": max(2, facts.plan.zero_stage)}


def _offload_param(facts: Facts, params: Params) -> Changes:
    return {"offload_param": params["device"], "zero_stage": 3}


ACTIONS: dict[str, Action] = {
    "input_pipeline": Action(
        frozenset({"dataloader_workers", "pin_memory"}),
        _input_pipeline,
        {"workers": 4, "pin_memory": True},
        uses=("device_type",),
    ),
    "mixed_precision": Action(
        frozenset({"precision"}),
        _mixed_precision,
        uses=("fast_bf16", "bf16_speed_ratio", "fp16_supported", "device_type"),
    ),
    "fused_attention": Action(
        frozenset({"attention"}), _fused_attention, uses=("flash_attn_available", "sdpa_available")
    ),
    "compile": Action(frozenset({"compile"}), _compile),
    "checkpoint_to_fit": Action(
        frozenset({"checkpoint_blocks", "micro_batch", "grad_accum"}),
        _checkpoint,
        {"all_blocks_above_share": 0.5},
        uses=(
            "checkpoint_blocks_to_fit",
            "block_count",
            "activation_share",
            "peak_bytes",
            "checkpoint_micro_batch",
            "checkpoint_micro_batch_ratio",
        ),  # fmt: skip
    ),
    "keep_global_batch": Action(
        frozenset({"micro_batch", "grad_accum"}),
        _keep_global_batch,
        uses=(
            "micro_batch_for_global_batch",
            "micro_batch_to_fit",
            "target_global_batch",
            "global_batch",
            "world_size",
            "peak_bytes",
        ),
    ),
    "zero": Action(
        frozenset({"zero_stage", "precision"}),
        _zero,
        {"stage": 1},
        {"stage": (1, 2, 3)},
        uses=("model_state_share", "peak_bytes", "inter_gbps"),
    ),
    "offload_optimizer": Action(
        frozenset({"offload_optimizer", "zero_stage"}),
        _offload_optimizer,
        {"device": "cpu"},
        {"device": ("cpu", "nvme")},
    ),
    "offload_param": Action(
        frozenset({"offload_param", "zero_stage"}),
        _offload_param,
        {"device": "cpu"},
        {"device": ("cpu", "nvme")},
    ),
}
"""Every action name a policy may use."""


def action_params(name: str, raw: Mapping[str, object]) -> dict[str, object]:
    """The action's parameters: defaults overlaid with ``raw``, checked.

    Raises:
        ValueError: an unknown parameter, or a value of the wrong type or outside its choices.
    """
    action = ACTIONS[name]
    params = dict(action.defaults)
    for key, value in raw.items():
        if key not in action.defaults:
            known = ", ".join(action.defaults) or "none"
            raise ValueError(f"unknown parameter {key!r} for action {name!r} (known: {known})")
        default = action.defaults[key]
        if type(value) is not type(default) and not (
            isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
        ):
            raise ValueError(f"{key} must be a {type(default).__name__}, not {value!r}")
        if key in action.choices and value not in action.choices[key]:
            raise ValueError(f"{key} must be one of {action.choices[key]}, not {value!r}")
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{key} must not be negative: {value!r}")
        params[key] = value
    return params
