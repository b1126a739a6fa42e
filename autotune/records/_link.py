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

    @property
    def gbps(self) -> float:
        """The bus bandwidth in Gbit/s, the unit of ``--inter-gbps``."""
        return self.bandwidth_bytes_per_s * 8 / 1e9
