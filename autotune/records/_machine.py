"""The machine a run plans for: its devices, their memory budget and where that figure came from,
the margin kept free, ranks per node, nodes and links. Resolved once, handed whole to every stage."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from autotune.records._errors import AutotuneError, named
from autotune.records._link import LinkMeasure
from autotune.records._units import parse_bytes

if TYPE_CHECKING:
    from autotune.records._profile import ProfileRecord

DEFAULT_MARGIN = 0.10
"""Share of the device budget every fit decision keeps free (what tensors do not show:
allocator fragmentation, communication buffers, the CUDA context)."""

BudgetSource = Literal["given", "device", "available_ram"]
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
SMALLEST_SIZE = 2**20
"""A bare int below this (1 MiB) is refused as a size: ``device_memory=80`` meant GB or GiB."""


@dataclass(frozen=True, kw_only=True)
class Machine:
    """What the target machine offers. ``None`` means "not known here", never zero.

    Checked when built: every bad field gives one line naming the field and its flag. A size
    (``device_memory``, ``host_memory``) is bytes, or a string with a unit such as ``"80GiB"``.
    """

    device: str = "auto"
    """Where steps run: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (``--device``)."""
    device_memory: int | None = None
    """Bytes each device may use, or a size such as ``"80GiB"`` (``--device-memory``); ``None``:
    no budget, fit unknown."""
    budget_source: BudgetSource | None = None
    """Where ``device_memory`` came from: the user, the profiled GPU, or (a CPU profile,
    nothing given) this machine's available memory. ``None`` while no budget is known."""
    margin: float = DEFAULT_MARGIN
    """Share of ``device_memory`` kept free: a plan fits when its peak is at most the rest
    (``--margin``)."""
    nproc_per_node: int = 1
    """Devices (ranks) on each node (``--nproc-per-node``)."""
    nnodes: int = 1
    """Nodes the devices spread over (``--nnodes``)."""
    intra_gbps: float | None = None
    """Link inside a node, Gbit/s (communication time); ``None``: unknown."""
    inter_gbps: float | None = None
    """Link between nodes, Gbit/s (``--inter-gbps``); ``None``: unknown."""
    link: LinkMeasure | None = None
    """The link a collective sweep measured between the plan's ranks (``autotune.runtime.link``);
    a given ``intra_gbps`` / ``inter_gbps`` overrides it. ``None``: not measured."""
    pcie_gbps: float | None = None
    """Host-device link, Gbit/s (offload time); ``None``: unknown."""
    pcie_source: Literal["given", "nvml"] | None = None
    """Where ``pcie_gbps`` came from: the user (``--pcie-gbps``), or the link NVML read on the
    profiled GPU (:meth:`with_default_budget`); ``None`` while it is unknown."""
    host_memory: int | None = None
    """Host RAM per node an offloaded plan's states may take, bytes or a size such as
    ``"512GiB"`` (``--host-memory``); ``None``: this machine's available memory, filled in with
    the budget (:meth:`with_default_budget`)."""

    def __post_init__(self) -> None:
        if not _DEVICE.fullmatch(self.device):
            raise AutotuneError(
                f"{named('device')}: must be auto, cpu, cuda or cuda:N (got {self.device!r})"
            )
        for field in ("device_memory", "host_memory"):
            object.__setattr__(self, field, _size(getattr(self, field), named(field)))
        if not 0.0 <= self.margin <= 0.9:
            raise AutotuneError(f"{named('margin')}: {self.margin:g} is not a share in [0, 0.9]")
        for field, flag in (("nproc_per_node", "--nproc-per-node"), ("nnodes", "--nnodes")):
            if getattr(self, field) < 1:
                raise AutotuneError(
                    f"{named(field, flag)}: must be >= 1 (got {getattr(self, field)})"
                )
        for field in ("intra_gbps", "inter_gbps", "pcie_gbps"):
            speed = getattr(self, field)
            if speed is not None and speed <= 0:
                raise AutotuneError(f"{named(field)}: must be > 0 (got {speed:g})")

    @property
    def world_size(self) -> int:
        """Devices in all."""
        return self.nproc_per_node * self.nnodes

    @property
    def usable(self) -> float | None:
        """The bytes a plan's predicted peak may reach: the budget less the margin (the one
        place this is computed); ``None`` without a budget."""
        if self.device_memory is None:
            return None
        return self.device_memory * (1.0 - self.margin)

    def fits(self, peak: float) -> bool | None:
        """Whether ``peak`` bytes fit in the usable part (``None``: no budget known)."""
        usable = self.usable
        return None if usable is None else peak <= usable

    def fits_host(self, host_bytes: float) -> bool | None:
        """Whether an offloaded plan's host bytes per node fit ``host_memory`` (``None``: not
        known; a plan that offloads nothing always fits)."""
        if host_bytes <= 0:
            return True
        return None if self.host_memory is None else host_bytes <= self.host_memory

    def with_host_memory(self) -> Machine:
        """This machine with ``host_memory`` filled in where not given: the available memory
        of this machine now (psutil), where an offloaded plan's host side would run."""
        if self.host_memory is not None:
            return self
        return replace(self, host_memory=available_memory())

    def with_default_budget(self, profile: ProfileRecord) -> Machine:
        """This machine with a budget filled in where none was given, for the profiled device
        (:meth:`with_budget_for`)."""
        gpu = profile.environment.device_memory_bytes if profile.config.device == "cuda" else None
        machine = self.with_budget_for(profile.config.device, gpu)
        if self.pcie_gbps is not None:
            return replace(machine, pcie_source=self.pcie_source or "given")
        if profile.environment.pcie_gbps is not None:
            return replace(machine, pcie_gbps=profile.environment.pcie_gbps, pcie_source="nvml")
        return machine

    def with_budget_for(self, device_type: str, gpu_memory: int | None) -> Machine:
        """This machine with a budget filled in where none was given: ``gpu_memory`` for a
        ``cuda`` device (none where it is not known), or on a CPU this machine's available
        memory now (psutil); and the host memory an offloaded plan may take
        (:meth:`with_host_memory`)."""
        if self.device_memory is not None:
            given = self if self.budget_source else replace(self, budget_source="given")
            return given.with_host_memory()
        if device_type == "cuda" and gpu_memory:
            return replace(
                self, device_memory=gpu_memory, budget_source="device"
            ).with_host_memory()
        if device_type == "cpu":  # one reading: the host is the device here
            free = available_memory()
            return replace(self, device_memory=free, budget_source="available_ram",
                           host_memory=self.host_memory or free)  # fmt: skip
        return self.with_host_memory()


def _size(value: object, name: str) -> int | None:
    """A size field as bytes: a whole number as given (at least :data:`SMALLEST_SIZE`), a string
    read by :func:`parse_bytes` (its unit required); ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_bytes(value, name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 80e9
    if not isinstance(value, int) or isinstance(value, bool):
        raise AutotuneError(
            f"{name}: give bytes or a size with a unit, e.g. '80GiB' (got {value!r})"
        )
    if value < 1:
        raise AutotuneError(f"{name}: must be positive (got {value} B)")
    if value < SMALLEST_SIZE:
        raise AutotuneError(f"{name}: {value} bytes? give a size with a unit, e.g. '{value}GiB'")
    return value


def available_memory() -> int:
    """This machine's available memory in bytes (psutil): the budget of a CPU step."""
    import psutil

    return int(psutil.virtual_memory().available)
