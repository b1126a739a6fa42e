"""The named facts a policy rule may test, and the kind of value each one holds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records import Plan, Record

Source = Literal["measured", "formula", "traced", "given", "plan", "refused"]
"""Where a fact's value came from: the profile, the estimate, an option, or the current plan;
``refused``: the profile's figure is outside its physical bounds, so the fact is unknown."""

FactKind = Literal["share", "ratio", "count", "bytes", "gbps", "fraction", "bool", "str"]


class Facts(Record):
    """What the policy knows about one plan of one model on one machine.

    ``None`` means "not known here" (not measured, no budget given); a clause
    over an unknown fact is false, so an unknown never triggers a change.
    ``sources`` says, per fact, whether it was measured, predicted or given.
    """

    plan: Plan
    device_type: str
    device_memory: int | None = None
    world_size: int = 1
    nnodes: int = 1
    nproc_per_node: int = 1
    inter_gbps: float | None = None
    input_share: float | None = None
    bf16_supported: bool = False
    fp16_supported: bool = False
    bf16_speed_ratio: float | None = None
    fast_bf16: bool = False
    compute_capability: float | None = None
    sdpa_available: bool = False
    flash_attn_available: bool = False
    has_block_stack: bool = False
    block_count: int | None = None
    is_transformer: bool = False
    target_global_batch: int | None = None
    peak_bytes: int | None = None
    fits: bool | None = None
    headroom: float | None = Field(None, description="(budget - peak) / budget; < 0 when over")
    activation_share: float | None = None
    model_state_share: float | None = None
    checkpoint_blocks_to_fit: int | None = Field(None, description="smallest k that fits")
    micro_batch_to_fit: int | None = Field(
        None, description="largest micro-batch <= current that fits"
    )
    micro_batch_for_global_batch: int | None = Field(
        None,
        description="largest micro-batch <= current that divides the per-rank share of the "
        "global batch (the target's, else the plan's) and fits with its accumulation (None: "
        "no budget, the target does not split over the ranks, or none fits)",
    )
    step_time_ratio: float | None = Field(None, description="predicted step time / baseline's")
    amp_peak_ratio: float | None = Field(
        None, description="predicted peak with bf16 autocast / now"
    )
    checkpoint_micro_batch: int | None = Field(
        None,
        description="a larger micro-batch that fits only with checkpointing and is predicted "
        "faster than any plan without it (None: checkpointing buys no speed)",
    )
    checkpoint_micro_batch_blocks: int | None = Field(
        None, description="the fewest checkpointed blocks with which that micro-batch fits"
    )
    checkpoint_micro_batch_ratio: float | None = Field(
        None, description="its predicted step time / the fastest plan's without checkpointing"
    )
    sources: dict[str, Source] = Field(default_factory=dict)

    def value(self, name: str) -> object:
        """A fact by name, including the current plan's knobs (``precision``, ``zero_stage``...)."""
        if name in _PLAN_FACTS:
            return getattr(self.plan, name)
        return getattr(self, name)

    def source(self, name: str) -> Source:
        """Where the fact came from (``plan`` for the current plan's knobs)."""
        return "plan" if name in _PLAN_FACTS else self.sources.get(name, "given")


_PLAN_FACTS: dict[str, FactKind] = {
    "precision": "str",
    "checkpoint_blocks": "count",
    "micro_batch": "count",
    "grad_accum": "count",
    "global_batch": "count",
    "zero_stage": "count",
    "offload_optimizer": "str",
    "offload_param": "str",
    "attention": "str",
    "compile": "bool",
    "dataloader_workers": "count",
    "pin_memory": "bool",
}

FACT_KINDS: dict[str, FactKind] = {
    "device_type": "str",
    "device_memory": "bytes",
    "world_size": "count",
    "nnodes": "count",
    "nproc_per_node": "count",
    "inter_gbps": "gbps",
    "input_share": "share",
    "bf16_supported": "bool",
    "fp16_supported": "bool",
    "bf16_speed_ratio": "ratio",
    "fast_bf16": "bool",
    "compute_capability": "ratio",
    "sdpa_available": "bool",
    "flash_attn_available": "bool",
    "has_block_stack": "bool",
    "block_count": "count",
    "is_transformer": "bool",
    "target_global_batch": "count",
    "peak_bytes": "bytes",
    "fits": "bool",
    "headroom": "fraction",
    "activation_share": "share",
    "model_state_share": "share",
    "checkpoint_blocks_to_fit": "count",
    "micro_batch_to_fit": "count",
    "micro_batch_for_global_batch": "count",
    "step_time_ratio": "ratio",
    "amp_peak_ratio": "ratio",
    "checkpoint_micro_batch": "count",
    "checkpoint_micro_batch_blocks": "count",
    "checkpoint_micro_batch_ratio": "ratio",
    **_PLAN_FACTS,
}
"""Every fact name a policy may use, with the kind of value it holds."""
