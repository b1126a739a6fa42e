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
LARGEST = 64 * 2**20
"""The sweep grows past its sizes, four times the last at a time, up to this many bytes ..."""
GROW_BELOW_S = 0.05
"""... while the slowest call at the last size takes less than this: on a fast link its
largest points then take tens of milliseconds, well above the latency and a CPU scheduler's
jitter, and on a slow one the sweep stays short. Over gloo on a 2-core CPU's loopback a 4-MiB
all-reduce takes about 4 ms, and all-reduce's bandwidth fitted on sweeps up to 4 MiB ranged
from 8 to 92 Gbit/s (four in a row), up to 16 MiB from 9.1 to 13.3, up to 64 MiB from 10.5 to
11.9 (about 2 s a sweep)."""
REPEATS = 5
COLLECTIVES: tuple[Collective, ...] = ("all_reduce", "all_gather", "reduce_scatter")


def _op(
    collective: Collective, nbytes: int, world: int, group: Any, buffers: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    """One call of ``collective`` over an fp32 tensor of ``nbytes`` (the full tensor), as
    DeepSpeed issues it on gloo and NCCL: ``all_gather_into_tensor``,
    ``reduce_scatter_tensor``; the tensors are views of ``buffers`` (the largest full tensor's,
    and its part), which every size shares."""
    count = max(nbytes // 4 // world, 1)
    full, part = buffers[0][: count * world], buffers[1][:count]
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    return lambda: dist.reduce_scatter_tensor(part, full, group=group)


def _timed(call: Callable[[], None], group: Any, device: torch.device | None) -> float:
    """Seconds of one ``call`` on this rank, started after a barrier."""
    dist.barrier(group)
    start = time.perf_counter()
    call()
    if device is not None:  # NCCL returns before the transfer ends
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _grown(sizes: Sequence[int], group: Any, device: torch.device | None,
           buffers: tuple[torch.Tensor, ...]) -> list[int]:  # fmt: skip
    """``sizes``, and the larger ones :data:`GROW_BELOW_S` lets in (each timed once on every
    rank, the slowest rank's time deciding, so every rank grows alike)."""
    world = dist.get_world_size(group)
    grown = sorted(set(sizes))
    while grown[-1] * 4 <= LARGEST:
        calls = [_op(c, grown[-1], world, group, buffers) for c in COLLECTIVES]
        for call in calls:  # untimed first: the buffers' first touch is not the link's
            call()
        slowest = torch.tensor([max(_timed(call, group, device) for call in calls)],
                               dtype=torch.float64, device=device)  # fmt: skip
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        if float(slowest) >= GROW_BELOW_S:
            break
        grown.append(grown[-1] * 4)
    return grown


def _buffers(nbytes: int, world: int, device: torch.device | None) -> tuple[torch.Tensor, ...]:
    """The full tensor of ``nbytes`` and its one-rank part, fp32."""
    full = torch.ones(max(nbytes // 4 // world, 1) * world, device=device)
    return full, torch.empty(full.numel() // world, device=device)


def sweep(
    group: Any = None, sizes: Sequence[int] = SIZES, repeats: int = REPEATS, grow: bool = True
) -> LinkMeasure:
    """Time each collective at each size over ``group`` (every rank must call this) and fit
    latency and bus bandwidth (:func:`autotune.estimator._comm.fit_link`).

    Each call starts after a barrier and counts on the slowest rank; a point is the median of
    its repeats, the repeats being rounds over every point, after one untimed call of each.

    Args:
        group: the process group (``None``: the default group, which must be initialised).
        sizes: bytes of each collective's full tensor (at least two distinct sizes).
        repeats: timed calls per collective and size.
        grow: add larger sizes while the link is fast (:data:`GROW_BELOW_S`, :data:`LARGEST`).

    Returns:
        The fitted link and its points, the same on every rank.
    """
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1 (got {repeats})")
    world = dist.get_world_size(group)
    if world < 2:
        raise ValueError("a link sweep needs a process group of two or more ranks")
    backend = str(dist.get_backend(group))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    buffers = _buffers(max(*sizes, LARGEST if grow else 0), world, device)
    sizes = _grown(sizes, group, device, buffers) if grow else list(sizes)
    keys = [(c, size) for c in COLLECTIVES for size in sizes]
    times = torch.zeros(len(keys), repeats, dtype=torch.float64)
    calls = [_op(collective, size, world, group, buffers) for collective, size in keys]
    for call in calls:
        call()
    for rep in range(repeats):  # repeats outermost: a burst of load elsewhere hits every point
        for row, call in enumerate(calls):
            times[row, rep] = _timed(call, group, device)
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
