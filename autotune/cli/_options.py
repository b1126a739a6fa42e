"""The options several commands share, declared once: the device, its memory budget and margin,
the ranks per node and nodes, the link between nodes, and --json; and the Machine they build."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli._common import above, device_name
from autotune.records import DEFAULT_MARGIN, AutotuneError, LinkMeasure, Machine, parse_bytes

DEVICE = typer.Option(
    None,
    "--device",
    callback=device_name,
    help="auto, cpu, cuda or cuda:N (default: auto; for confirm, the device the profile ran on).",
)
DEVICE_MEMORY = typer.Option(
    None,
    "--device-memory",
    help="Memory each device may use, with a unit: 80GiB or 80Gi (2^30 B), 80GB or 80G (10^9 B). "
    "Default: the profiled GPU's; on a CPU, this machine's available memory.",
)
MARGIN = typer.Option(
    DEFAULT_MARGIN,
    "--margin",
    min=0.0,
    max=0.9,
    help="Share of --device-memory every fit decision keeps free: the policy's, the estimate's "
    "and the search's pruning.",
)
NPROC_PER_NODE = typer.Option(
    Machine.nproc_per_node,
    "--nproc-per-node",
    min=1,
    help="Devices (ranks) on each node, as torchrun counts them.",
)
NNODES = typer.Option(Machine.nnodes, "--nnodes", min=1, help="Nodes, as torchrun counts them.")
PCIE_GBPS = typer.Option(
    None, "--pcie-gbps", callback=above(0), help="Host-device link, Gbit/s (offload time)."
)
HOST_MEMORY = typer.Option(
    None,
    "--host-memory",
    help="Host RAM per node an offloaded plan may take, with a unit (e.g. 512GiB); "
    "default: this machine's available memory.",
)
INTER_GBPS = typer.Option(
    None,
    "--inter-gbps",
    callback=above(0),
    help="Link between nodes, Gbit/s (<= 100 counts as slow): the communication time of "
    "plans over nodes.",
)
JSON = typer.Option(False, "--json", help="Print only the record as JSON on stdout.")
LINK = typer.Option(
    None,
    "--link",
    help="The link a tune's ranks swept, with each engine's own cost they measured: the tune "
    "record (autotune-tune.json) or the link's JSON. Step times then count both, as tune's do "
    "(a link speed given as well still times the communication).",
)

AUTOCAST = typer.Option(
    None,
    "--autocast",
    help="off (fp32), or torch.autocast to bf16 or fp16 with fp32 weights. Not a plan's "
    "precision=bf16, which means DeepSpeed's 16-bit weights.",
)

# Flags renamed (device counts to torchrun's words, autocast to its own word); each is
# refused with one line naming the new ones.
_RENAMED = {
    "precision": "--precision: renamed to --autocast off|bf16|fp16 (precision= in a plan "
    "means DeepSpeed's 16-bit weights)",
    "world_size": "--world-size: renamed; give --nproc-per-node N (devices per node) and "
    "--nnodes M (nodes): N x M devices in all",
    "gpus_per_node": "--gpus-per-node: renamed to --nproc-per-node",
    "nodes": "--nodes: renamed to --nnodes",
}
RENAMED_WORLD_SIZE = typer.Option(None, "--world-size", hidden=True)
RENAMED_GPUS_PER_NODE = typer.Option(None, "--gpus-per-node", hidden=True)
RENAMED_NODES = typer.Option(None, "--nodes", hidden=True)
RENAMED_PRECISION = typer.Option(None, "--precision", hidden=True)


def refuse_renamed(**given: object) -> None:
    """Refuse a renamed flag that was given, with one line naming its new words."""
    for name, value in given.items():
        if value is not None:
            raise AutotuneError(_RENAMED[name])


def machine(
    *,
    device: str | None = None,
    device_memory: str | None = None,
    margin: float = DEFAULT_MARGIN,
    nproc_per_node: int = Machine.nproc_per_node,
    nnodes: int = Machine.nnodes,
    inter_gbps: float | None = None,
    intra_gbps: float | None = None,
    pcie_gbps: float | None = None,
    host_memory: str | None = None,
    link: Path | None = None,
) -> Machine:
    """The :class:`Machine` the shared options describe (the budget parsed, unit required; the
    link read, :func:`read_link`)."""
    budget = parse_bytes(device_memory, "--device-memory") if device_memory else None
    host = parse_bytes(host_memory, "--host-memory") if host_memory else None
    return Machine(device=device or Machine.device, device_memory=budget, margin=margin,
                   nproc_per_node=nproc_per_node, nnodes=nnodes, inter_gbps=inter_gbps,
                   intra_gbps=intra_gbps, pcie_gbps=pcie_gbps, host_memory=host,
                   link=read_link(link) if link is not None else None)  # fmt: skip


def read_link(path: Path) -> LinkMeasure:
    """``--link``: the ``link`` of a tune record, or a link record itself.

    Raises:
        AutotuneError: one line naming the file: unreadable, not JSON, a tune record without a
            link (no multi-rank trial swept one), or not a link.
    """
    from autotune.records import read_json, validate_record

    data = read_json(path, "--link")
    if isinstance(data, dict) and "link" in data:  # a tune record
        if data["link"] is None:
            raise AutotuneError(f"--link: {path}: the tune record holds no link (none of its "
                                "trials ran on two or more ranks)")  # fmt: skip
        data = data["link"]
    elif not isinstance(data, dict) or "points" not in data:
        raise AutotuneError(f"--link: {path}: neither a tune record (autotune-tune.json) nor a "
                            "link record")  # fmt: skip
    return validate_record(data, LinkMeasure, f"--link: {path}", "link")
