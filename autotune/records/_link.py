"""The link between ranks as a collective sweep measured it: latency, bus bandwidth, the points."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.records._base import Record

Collective = Literal["all_reduce", "all_gather", "reduce_scatter"]


class LinkPoint(Record):
    """One collective at one size: the median of its timed repeats."""

    collective: Collective
    nbytes: int = Field(
        gt=0,
        description="the collective's full tensor: all_reduce's buffer, all_gather's output, "
        "reduce_scatter's input (NCCL-tests' size)",
    )
    seconds: float = Field(gt=0, description="median over the repeats, slowest rank's view")
    low: float = Field(gt=0, description="fastest repeat")
    high: float = Field(gt=0, description="slowest repeat")
    repeats: int = Field(ge=1)


class LinkFit(Record):
    """Latency and bus bandwidth of one collective, or of all together."""

    latency_s: float = Field(ge=0, description="fitted seconds per call")
    bandwidth_bytes_per_s: float = Field(gt=0, description="fitted bus bandwidth")


class EngineCost(Record):
    """The seconds an engine's own code adds to a step on these ranks beyond what the time
    model counts (the compute a profile measures, the collectives :mod:`autotune.estimator._comm`
    times): its hooks, bucketing, copies and bookkeeping. Measured on stacks of square matrices
    (:mod:`autotune.runtime.trial.engine_cost`), each figure fitted as ``fixed + per_tensor *
    parameter tensors + per_element * parameter elements + per_module * sharded modules``
    (FSDP2's: each block, and the root; none under DeepSpeed)."""

    engine: str = Field(
        description="the engine key: deepspeed-<stage>-<fp32|bf16> or "
        "fsdp2-<2|3>-<fp32|bf16> (autotune.estimator.engine_key)"
    )
    micro_fixed_s: float = Field(description="per micro-batch, whatever the model")
    micro_per_tensor_s: float = Field(ge=0, description="per micro-batch, per parameter tensor")
    micro_per_module_s: float = Field(
        default=0.0, ge=0, description="per micro-batch, per sharded module"
    )
    micro_per_element_s: float = Field(
        default=0.0, ge=0, description="per micro-batch, per parameter element"
    )
    step_fixed_s: float = Field(description="per optimizer step (the accumulation boundary)")
    step_per_tensor_s: float = Field(ge=0, description="per optimizer step, per parameter tensor")
    step_per_module_s: float = Field(
        default=0.0, ge=0, description="per optimizer step, per sharded module"
    )
    step_per_element_s: float = Field(
        default=0.0, ge=0, description="per optimizer step, per parameter element"
    )
    blocks: list[int] = Field(description="blocks of each stack measured")
    per_block: list[int] = Field(description="matrices per block of each stack")
    width: list[int] = Field(
        default_factory=list,
        description="matrix width of each stack (empty in records that measured 8x8 stacks only)",
    )
    steps: int = Field(ge=1, description="timed optimizer steps on each stack")


class LinkMeasure(Record):
    """Latency and bus bandwidth fitted to a sweep of collectives over a process group.

    Time of one collective = ``latency_s + bus_bytes / bandwidth_bytes_per_s``, where
    ``bus_bytes`` is what each rank sends in a ring: ``2 (n-1)/n`` of an all-reduce's buffer,
    ``(n-1)/n`` of an all-gather's output or a reduce-scatter's input (NCCL-tests' "bus
    bandwidth"), so one figure serves every collective and every world size.
    """

    source: Literal["measured"] = "measured"
    world_size: int = Field(ge=2)
    backend: str = Field(description="the process group's backend, e.g. gloo or nccl")
    latency_s: float = Field(ge=0, description="fitted seconds per call, all collectives")
    bandwidth_bytes_per_s: float = Field(gt=0, description="fitted bus bandwidth, all collectives")
    collectives: dict[Collective, LinkFit] = Field(
        default_factory=dict, description="each collective's own fit, where it was swept"
    )
    points: list[LinkPoint]
    engine_costs: list[EngineCost] = Field(
        default_factory=list,
        description="what each engine's own code adds per micro-batch and per step on these "
        "ranks, measured after the sweep or kept from an earlier one on this machine "
        "(engine_costs_kept); none where not asked for",
    )
    engine_costs_kept: list[str] = Field(
        default_factory=list,
        description="the engines of engine_costs read from engine_costs_file, measured by an "
        "earlier sweep on this machine, with these versions, ranks and threads, not by this one",
    )
    engine_costs_file: str | None = Field(
        default=None,
        description="the file this machine keeps its engines' costs in for such a group "
        "(autotune.runtime.trial.engine_cost; None: not kept, for a group over several "
        "machines, or none asked for)",
    )

    def engine_cost(self, key: str) -> EngineCost | None:
        """The measured cost of the engine ``key`` (``None``: not measured)."""
        return next((cost for cost in self.engine_costs if cost.engine == key), None)

    @property
    def gbps(self) -> float:
        """The bus bandwidth in Gbit/s, the unit of ``--inter-gbps``."""
        return self.bandwidth_bytes_per_s * 8 / 1e9
