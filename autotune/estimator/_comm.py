"""Communication time of a plan: the collectives each engine issues per optimizer step, timed
on a link: a sweep's measured points (a fitted latency and bus bandwidth outside them), or a
given bandwidth. Pure: no torch.

The schedules are DeepSpeed 0.19's and FSDP2's, read from their source and counted by wrapping
``torch.distributed`` in a 2-rank run (``tests/runtime/test_shaped_link.py``):

- ZeRO-0/1 all-reduce the gradients once per optimizer step (at the accumulation boundary);
  ZeRO-1 then all-gathers the updated parameters.
- ZeRO-2 all-reduces the gradients every micro-batch (``reduce_scatter: true`` still ends in one
  all-reduce per bucket: ``use_multi_rank_bucket_allreduce`` defaults to true), then
  all-gathers the updated parameters once per step.
- ZeRO-3 all-gathers the parameters in forward and reduce-scatters the gradients, every
  micro-batch. It gathers a parameter again in backward only where it released it after
  forward: where its next use lies past ``stage3_max_reuse_distance`` or the gathered
  parameters pass ``stage3_max_live_parameters`` (both 1e9 by DeepSpeed's default, which the
  emitted configs keep). Counted: with the defaults a 1M-parameter model is gathered once per
  micro-batch; with both at 0, twice. Modelled: in a uniform stack of P elements the parameter at
  depth x is reused 2P(1 - x) elements later, so the first ``1 - K / 2P`` of the stack is
  gathered again, K the smaller limit: none of a model under 500M parameters (not checked on
  one larger).
- FSDP2 (``fully_shard`` on each block of the stack, then on the root, as autotune applies it)
  issues one all-gather per unit (each block, and the root's own parameters) every micro-batch
  in forward, one per block again in backward where it reshards after forward (stage 3; the
  root is kept gathered for backward), and one reduce-scatter per unit every micro-batch.
  Counted in a 2-rank run with 2 and 6 blocks: per micro-batch 5 and 13 all-gathers at stage 3
  (3 and 7 at stage 2), 3 and 7 reduce-scatters. On a slow-latency link (gloo: ~1 ms a call)
  the count, not the bytes, sets a small model's time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from autotune.estimator import _costmodel as cm
from autotune.records import Collective, LinkFit, LinkMeasure, LinkPoint, Machine, Plan

STAGE3_KEEP_ELEMENTS = 1_000_000_000
"""DeepSpeed's ``stage3_max_reuse_distance`` and ``stage3_max_live_parameters`` (elements, both
1e9 by default), which the emitted configs leave as they are."""
STAGE3_PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold`` (elements): smaller parameters stay gathered (one
all-gather per step for their updates; the estimate leaves them in the per-micro-batch volume,
which overcounts by their share, small by definition)."""


@dataclass(frozen=True)
class Calls:
    """``count`` calls per optimizer step of one collective, ``elements`` in all over them
    (the full tensors: all-reduce's buffer, all-gather's output, reduce-scatter's input)."""

    collective: Collective
    elements: float
    count: int


@dataclass(frozen=True)
class Link:
    """A link's latency per call and bus bandwidth, where the figures came from, each
    collective's own ``(latency_s, bytes_per_s)`` where measured (the rest take the pair), and
    each collective's swept ``(bytes, seconds)`` points by size, where swept."""

    latency_s: float
    bytes_per_s: float
    source: str
    by_collective: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    points: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    def speed(self, collective: Collective) -> tuple[float, float]:
        """``(latency_s, bytes_per_s)`` of one collective on this link."""
        return self.by_collective.get(collective, (self.latency_s, self.bytes_per_s))

    def call_seconds(self, collective: Collective, nbytes: float, world_size: int) -> float:
        """Seconds of one call on a full tensor of ``nbytes``. Inside the swept sizes: the
        time between the two points around it; above them: the largest point's plus the top two
        points' seconds per byte; below them, or not swept: latency plus bus bytes over bandwidth.

        The fit weighs every size alike, so where small messages pass faster than the link's
        rate (a switch's buffer, tc's burst) it overstates the bandwidth large ones get: on a
        1 Gbit/s tbf link, the fit said 0.68 Gbit/s and the 1 and 4 MiB all-reduces ran at 0.50.
        """
        latency, bandwidth = self.speed(collective)
        fitted = latency + nbytes * bus_share(collective, world_size) / bandwidth
        swept = self.points.get(collective, ())
        if len(swept) < 2 or nbytes < swept[0][0]:
            return fitted
        for (low, before), (high, after) in zip(swept, swept[1:], strict=False):
            if nbytes <= high:
                return before + (after - before) * (nbytes - low) / (high - low)
        (low, before), (high, after) = swept[-2:]
        per_byte = (after - before) / (high - low)
        if per_byte <= 0:  # noise: the top two points do not grow
            per_byte = bus_share(collective, world_size) / bandwidth
        return after + (nbytes - high) * per_byte


def bus_share(collective: Collective, world_size: int) -> float:
    """Share of a collective's full tensor each rank sends in a ring: ``2(n-1)/n`` for an
    all-reduce, ``(n-1)/n`` for an all-gather or a reduce-scatter (NCCL-tests' bus factor)."""
    share = (world_size - 1) / world_size
    return 2 * share if collective == "all_reduce" else share


def step_calls(
    plan: Plan,
    parameters: float,
    parameter_sizes: Sequence[int] | None = None,
    *,
    keep_elements: int = STAGE3_KEEP_ELEMENTS,
    blocks: int = 0,
    block_parameters: int | None = None,
) -> list[Calls]:
    """The collectives a plan issues per optimizer step over its data-parallel ranks.

    Args:
        plan: engine, stage, ranks and accumulation.
        parameters: trainable elements (the gradients reduced, the parameters gathered).
        parameter_sizes: each parameter's elements; sizes the count of ZeRO-3 gathers (one per
            parameter above the persistence threshold; ``None``: one per step).
        keep_elements: the smaller of DeepSpeed's ``stage3_max_reuse_distance`` and
            ``stage3_max_live_parameters`` (:func:`regathered_share`).
        blocks: blocks in the repeated stack, each its own FSDP2 unit (0: none found, the root
            alone is sharded).
        block_parameters: elements of one block: what FSDP2 gathers again in backward (``None``:
            not known, taken as all the parameters).
    """
    if plan.world_size <= 1 or parameters <= 0:
        return []
    ga, psi = plan.grad_accum, float(parameters)
    sharded_params = plan.engine == "fsdp2" or plan.zero_stage >= 3
    if not sharded_params:
        calls = [Calls("all_reduce", psi * (ga if plan.zero_stage == 2 else 1),
                       ga if plan.zero_stage == 2 else 1)]  # fmt: skip
        if plan.zero_stage >= 1:
            calls.append(Calls("all_gather", psi, 1))
        return calls
    if plan.engine == "fsdp2":
        return _fsdp2_calls(plan, psi, blocks, block_parameters)
    gathers = max(1, sum(size > STAGE3_PERSISTENCE_THRESHOLD for size in parameter_sizes or ()))
    again = regathered_share(psi, keep_elements)
    return [
        Calls("all_gather", psi * ga, gathers * ga),
        Calls("all_gather", psi * again * ga, math.ceil(gathers * again) * ga),
        Calls("reduce_scatter", psi * ga, ga),
    ]


def _fsdp2_calls(plan: Plan, psi: float, blocks: int, block_parameters: int | None) -> list[Calls]:
    """FSDP2's collectives per step: per micro-batch one all-gather per unit in forward, one per
    block again in backward at stage 3, one reduce-scatter per unit."""
    ga, units = plan.grad_accum, blocks + 1
    stack = min(psi, blocks * block_parameters) if block_parameters else psi if blocks else 0.0
    regathered = blocks if plan.reshard_after_forward else 0
    return [
        Calls("all_gather", psi * ga, units * ga),
        Calls("all_gather", (stack if regathered else 0.0) * ga, regathered * ga),
        Calls("reduce_scatter", psi * ga, units * ga),
    ]


def regathered_share(parameters: float, keep_elements: int) -> float:
    """Share of a ZeRO-3 model's parameters gathered again in backward: those whose backward
    use lies ``keep_elements`` or more elements of fetches after their forward use. In a
    uniform stack of P elements the parameter at depth x (0..1) is reused 2P(1 - x) later."""
    if parameters <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - keep_elements / (2.0 * parameters)))


def bus_bytes(calls: Sequence[Calls], world_size: int, bytes_per_element: float) -> float:
    """Bytes each rank sends per step for ``calls``."""
    return sum(c.elements * bus_share(c.collective, world_size) for c in calls) * bytes_per_element


def collective_seconds(
    calls: Sequence[Calls], world_size: int, bytes_per_element: float, link: Link
) -> float:
    """Seconds the calls take on ``link``: each call's (:meth:`Link.call_seconds`, its full
    tensor an equal share of its collective's elements) times the count."""
    total = 0.0
    for c in calls:
        if c.elements > 0:
            count = max(1, c.count)
            nbytes = c.elements * bytes_per_element / count
            total += count * link.call_seconds(c.collective, nbytes, world_size)
    return total


def plan_link(machine: Machine, plan: Plan) -> Link | None:
    """The link a plan's collectives cross: the one given for its tier (``--inter-gbps`` when
    it spans nodes, ``--intra-gbps`` inside one; no latency), else the measured sweep's, else
    ``None`` (time unknown)."""
    flag, gbps = (
        ("--inter-gbps", machine.inter_gbps) if plan.nnodes > 1 else ("--intra-gbps", machine.intra_gbps)
    )  # fmt: skip
    if gbps is not None:
        return Link(0.0, gbps * 1e9 / 8.0, f"given {flag}")
    return None if machine.link is None else measured_link(machine.link)


def measured_link(measured: LinkMeasure) -> Link:
    """The link a sweep measured: its fits, and its points by size."""
    return Link(
        measured.latency_s,
        measured.bandwidth_bytes_per_s,
        by_collective={
            name: (f.latency_s, f.bandwidth_bytes_per_s) for name, f in measured.collectives.items()
        },  # fmt: skip
        points=swept_points(measured),
        source=f"measured link sweep ({measured.world_size} ranks, {measured.backend}: "
        f"{measured.latency_s * 1e6:.0f} us + {measured.gbps:.3g} Gbit/s bus)",
    )


def swept_points(measured: LinkMeasure) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each collective's ``(bytes, seconds)`` points of a sweep, by size; none for a collective
    without a fit of its own (its points do not grow with size: noise, timed on the whole fit)
    or with fewer than two sizes."""
    by: dict[str, dict[float, float]] = {}
    for p in measured.points:
        if p.collective in measured.collectives:
            by.setdefault(p.collective, {})[float(p.nbytes)] = p.seconds
    return {c: tuple(sorted(sizes.items())) for c, sizes in by.items() if len(sizes) >= 2}


def fit_link(points: Sequence[LinkPoint], world_size: int) -> tuple[float, float]:
    """Latency (s) and bus bandwidth (bytes/s): ``seconds = a + x / b`` fitted by least squares
    of the relative residuals (each point weighted ``1/seconds^2``, so 64 KiB counts as much as
    16 MiB), ``x`` each point's bus bytes (:func:`bus_share`); latency clipped at 0.

    Raises:
        ValueError: fewer than two distinct sizes, or times that do not grow with size.
    """
    rows = [(p.nbytes * bus_share(p.collective, world_size), p.seconds, p.seconds**-2)
            for p in points]  # fmt: skip
    total = sum(w for _, _, w in rows)
    mean_x = sum(w * x for x, _, w in rows) / total if rows else 0.0
    mean_y = sum(w * y for _, y, w in rows) / total if rows else 0.0
    sxx = sum(w * (x - mean_x) ** 2 for x, _, w in rows)
    if len(rows) < 2 or sxx <= 0:
        raise ValueError("a link fit needs points at two or more sizes")
    slope = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in rows) / sxx
    if slope <= 0:
        raise ValueError(f"collective times do not grow with size (slope {slope:g} s/byte)")
    latency = mean_y - slope * mean_x
    if latency < 0:  # through the origin instead: no negative latency
        latency = 0.0
        slope = sum(w * x * y for x, y, w in rows) / sum(w * x * x for x, _, w in rows)
    return latency, 1.0 / slope


def link_measure(points: Sequence[LinkPoint], world_size: int, backend: str) -> LinkMeasure:
    """The record of a sweep: its points and the fit (:func:`fit_link`); a collective whose own
    points do not grow with size (a noisy sweep of a fast link) has no fit of its own, and is
    timed on the fit of all the points.

    Raises:
        ValueError: all the points together do not grow with size (:func:`fit_link`).
    """
    latency, bandwidth = fit_link(points, world_size)
    fits = {}
    for collective in dict.fromkeys(p.collective for p in points):
        own = [p for p in points if p.collective == collective]
        if len({p.nbytes for p in own}) >= 2:
            try:
                lat, bw = fit_link(own, world_size)
            except ValueError:
                continue
            fits[collective] = LinkFit(latency_s=lat, bandwidth_bytes_per_s=bw)
    return LinkMeasure(world_size=world_size, backend=backend, latency_s=latency,
                       bandwidth_bytes_per_s=bandwidth, collectives=fits,
                       points=list(points))  # fmt: skip


def step_communication(
    plan: Plan,
    parameters: float,
    parameter_sizes: Sequence[int] | None,
    machine: Machine,
    *,
    blocks: int = 0,
    block_parameters: int | None = None,
) -> tuple[float, float | None, str | None]:
    """A plan's bytes each rank sends per optimizer step, their seconds on the machine's link
    (``None``: no link known) and a note naming the link's source (``None``: nothing sent);
    ``blocks`` and ``block_parameters`` as :func:`step_calls` takes them."""
    calls = step_calls(plan, parameters, parameter_sizes, blocks=blocks,
                       block_parameters=block_parameters)  # fmt: skip
    width = cm.communicated_bytes_per_element(plan.precision)
    nbytes = bus_bytes(calls, plan.world_size, width)
    if nbytes <= 0:
        return 0.0, 0.0, None
    link = plan_link(machine, plan)
    if link is None:
        return nbytes, None, None
    seconds = collective_seconds(calls, plan.world_size, width, link)
    return nbytes, seconds, f"communication timed on the {link.source}"
