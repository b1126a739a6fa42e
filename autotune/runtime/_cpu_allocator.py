"""c10's CPU allocator during one plain step, read from torch.profiler's memory events."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from autotune.runtime import _memory as mem


@dataclass(frozen=True)
class AllocatorWindow:
    """c10's CPU allocations during one block, as torch.profiler's memory events report them."""

    peak_rise: int
    """The most bytes allocated inside the block and live at one moment."""
    pointers: frozenset[int]
    """The address of every block allocated inside it."""


def watch_cpu_allocator(run: Callable[[], object]) -> AllocatorWindow:
    """Run ``run`` under torch.profiler with ``profile_memory`` (no shapes, no stacks) only.

    No dispatch mode is active, so the step allocates as the user's own does: under any
    ``TorchDispatchMode`` (this module's tracker, MemTracker) autograd treats every tensor
    as a subclass and accumulates gradients out of place (transformers' Mamba scan: +6.7 %).
    Blocks from before the window are not counted, nor are frees of them.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU]
    with (
        _without_profiler_lines(),
        torch_profile(activities=activities, profile_memory=True) as prof,
    ):
        run()
    events = sorted(  # by time only: a block freed and another made at one tick keep their order
        (
            (node.start_time_ns, node.typed[1].ptr, node.typed[1].alloc_size)
            for node in _event_nodes(prof.profiler.kineto_results.experimental_event_tree())
            if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu"
        ),
        key=lambda event: event[0],
    )
    live: dict[int, int] = {}
    pointers: set[int] = set()
    current = peak = 0
    for index, (when, ptr, size) in enumerate(events):
        if size > 0:
            live[ptr], current = size, current + size
            pointers.add(ptr)
        elif ptr in live:
            current -= live.pop(ptr)
        if index + 1 == len(events) or events[index + 1][0] != when:  # a moment's last event
            peak = max(peak, current)
    return AllocatorWindow(peak, frozenset(pointers))


_PROFILER_LINES = ("SyncActivityProfilerHandler", "Memory block of unknown size")
"""What kineto (start, stop) and c10 (a free of a block from before the window) print to
stderr around every profiled window: noise in ``autotune profile``'s output."""


@contextlib.contextmanager
def _without_profiler_lines() -> Iterator[None]:
    """Hold the process's stderr (fd 2) during the block, then pass on all but the profiler's lines."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (a closed stderr): nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            lines = text.splitlines(keepends=True)
            sys.stderr.write("".join(x for x in lines if not any(m in x for m in _PROFILER_LINES)))


def _event_nodes(nodes: Iterable[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _event_nodes(node.children)


def untracked_batch_bytes(batch: Any, pointers: frozenset[int]) -> int:
    """Bytes of a batch no allocation in ``pointers`` made (DataLoader workers' shared memory).

    A tensor that is a view into a larger storage (a data set) is left out, as in
    :meth:`~autotune.runtime._memory.LiveTensorTracker.mark_batch`.
    """
    return mem.unique_bytes(
        tensor
        for tensor in mem.iter_tensors(batch)
        if tensor.device.type == "cpu"
        and tensor.untyped_storage().data_ptr() not in pointers
        and 0 < tensor.untyped_storage().nbytes() <= tensor.numel() * tensor.element_size()
    )
