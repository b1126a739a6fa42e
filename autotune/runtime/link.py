"""Measure the link between the ranks of a live process group: a short sweep of all-reduce,
all-gather and reduce-scatter at a few sizes, fitted to latency and bus bandwidth."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from autotune.estimator import link_measure
from autotune.records import Collective, LinkMeasure, LinkPoint

SIZES = (64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20)
"""Bytes of each collective's full tensor: from latency-bound to bandwidth-bound; the whole
sweep moves about 6 MiB per rank per repeat (under 1 s at 1 Gbit/s with 5 repeats)."""
REPEATS = 5
COLLECTIVES: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter")


def _op(
    collective: Collective, nbytes: int, world: int, group: Any, device: torch.device
) -> Callable[[], None]:
    """One call of ``collective`` over an fp32 tensor of ``nbytes`` (the full tensor) on
    ``device``, as DeepSpeed issues it on gloo and NCCL: ``all_gather_into_tensor``,
    ``reduce_scatter_tensor``."""
    full = torch.ones(max(nbytes // 4 // world, 1) * world, device=device)
    part = torch.empty(full.numel() // world, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    return lambda: dist.reduce_scatter_tensor(part, full, group=group)


def sweep(group: Any = None, sizes: Sequence[int] = SIZES, repeats: int = REPEATS) -> LinkMeasure:
    """Time each collective at each size over ``group`` (every rank must call this) and fit
    latency and bus bandwidth (:func:`autotune.estimator._comm.fit_link`).

    Each call starts after a barrier and counts on the slowest rank; a point is the median of
    its repeats, the repeats being rounds over every point, after one untimed call of each.

    Args:
        group: the process group (``None``: the default group, which must be initialised).
        sizes: bytes of each collective's full tensor (at least two distinct sizes).
        repeats: timed calls per collective and size.

    Returns:
        The fitted link and its points, the same on every rank.
    """
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1 (got {repeats})")
    world = dist.get_world_size(group)
    if world < 2:
        raise ValueError("a link sweep needs a process group of two or more ranks")
    keys = [(c, size) for c in COLLECTIVES for size in sizes]
    times = torch.zeros(len(keys), repeats, dtype=torch.float64)
    backend = str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    calls = [_op(collective, size, world, group, device or torch.device("cpu"))
             for collective, size in keys]  # fmt: skip
    for call in calls:
        call()
    for rep in range(repeats):  # repeats outermost: a burst of load elsewhere hits every point
        for row, call in enumerate(calls):
            dist.barrier(group)
            start = time.perf_counter()
            call()
            if device is not None:  # NCCL returns before the transfer ends
                torch.cuda.synchronize(device)
            times[row, rep] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # the slowest rank's view
    points = [
        LinkPoint(collective=collective, nbytes=size,
                  seconds=statistics.median(times[row].tolist()),
                  low=float(times[row].min()), high=float(times[row].max()), repeats=repeats)
        for row, (collective, size) in enumerate(keys)
    ]  # fmt: skip
    return link_measure(points, world, backend)


def trial_link() -> LinkMeasure | None:
    """The link between a trial's ranks, swept once its steps are done: every rank calls this
    after the trial; ``None`` in a single-process trial, or where the sweep's times do not grow
    with size (a noisy sweep of a fast link: the trial's own result stands, the next trial
    sweeps again)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    try:
        return sweep()
    except ValueError as error:  # every rank fits the same all-reduced times: all get here
        print(f"autotune: link sweep not fitted ({error}); the trial stands without it",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
