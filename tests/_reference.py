"""The independent reference for memory: torch.profiler's memory timeline around a hand-written step.

Nothing here calls autotune: the step is written out (forward, backward, optimizer
step, as any training loop does) and the bytes come from torch's own memory profiler,
categorised by torch. Tests compare autotune's measurement with it.

torch.profiler's memory timeline is a private API (``prof._memory_profile()``, its
``timeline`` of ``(time, action, (key, version), bytes)`` events and ``_categories``);
the torch range in pyproject.toml is the one it was checked with.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action, Category, TensorKey

CATEGORY_NAMES = {
    Category.PARAMETER: "parameters",
    Category.OPTIMIZER_STATE: "optimizer_states",
    Category.GRADIENT: "gradients",
    Category.ACTIVATION: "activations",  # saved for backward, autocast's weight copies included
    Category.INPUT: "inputs",  # the batch (and BatchNorm's running statistics)
    Category.TEMPORARY: "temporaries",
    Category.AUTOGRAD_DETAIL: "temporaries",  # gradients of activations flowing back
    None: "unknown",
}


@dataclass(frozen=True)
class Reference:
    """The profiler's peak of live CPU bytes in one step, and the bytes by category then.

    ``allocator`` is the same profile read another way: the bytes alive at the step's
    start plus the peak rise of c10's CPU ``total_allocated`` over the step's allocation
    events (:func:`allocator_peak`). It counts every allocation, tensor or not, and needs
    no categorisation, so it is there where the timeline is not (FSDP2) or misses bytes.
    """

    peak: int
    at_peak: dict[str, int]
    allocator: int = 0


def _state_pointers(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, int]:
    """The storages from before the step that count, with their bytes: the training state
    (not a data set)."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def _peak(prof: Any, keep: set[int] | dict[int, int]) -> Reference:
    """The peak of the profiled window, counting of the storages from before it only ``keep``.

    ``keep`` may map each kept storage's data pointer to its bytes: a storage no op touches
    in the window never appears in torch's timeline (an idle buffer from an earlier step),
    yet it occupies memory throughout, so it is added as ``untouched``.
    """
    memory = prof._memory_profile()
    events, categories = memory.timeline, memory._categories
    cpu = torch.device("cpu")
    live = dict.fromkeys([*CATEGORY_NAMES.values(), "untouched"], 0)
    dropped: set[Any] = set()
    seen = {key.storage.ptr for _, _, (key, _), _ in events if isinstance(key, TensorKey)}
    untouched = (
        sum(size for ptr, size in keep.items() if ptr not in seen) if isinstance(keep, dict) else 0
    )
    live["untouched"] = untouched
    total = peak = untouched
    at_peak = dict(live)

    def name(key: Any, version: int) -> str:
        return CATEGORY_NAMES[categories.get(key, version) if isinstance(key, TensorKey) else None]

    for index, (when, action, (key, version), nbytes) in enumerate(events):
        if key.device != cpu:
            continue
        if action == Action.PREEXISTING and (
            not isinstance(key, TensorKey) or key.storage.ptr not in keep
        ):
            dropped.add(key)
            continue
        if key in dropped:
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            live[name(key, version)] += nbytes
            total += nbytes
        elif action == Action.INCREMENT_VERSION:
            live[name(key, version)] -= nbytes
            live[name(key, version + 1)] += nbytes
        elif action == Action.DESTROY:
            live[name(key, version)] -= nbytes
            total -= nbytes
        last_of_moment = index + 1 == len(events) or events[index + 1][0] != when
        if last_of_moment and total > peak:
            peak, at_peak = total, dict(live)
    return Reference(peak, at_peak)


def allocator_peak(prof: Any, start_bytes: int) -> int:
    """``start_bytes`` plus the largest rise of c10's CPU ``total_allocated`` in the window.

    c10's CPU reporter counts only what is allocated while memory profiling is on (and
    skips frees of older blocks), and its total carries over between profiling windows,
    so the figure is a rise from the window's first event, added to the bytes the caller
    knows alive at its start. A storage from before the window that is freed inside it
    is not subtracted: the figure is then high by at most those bytes.
    """
    from torch._C._profiler import _EventType

    def events(nodes: Any) -> Iterator[Any]:
        for node in nodes:
            yield node
            yield from events(node.children)

    allocations = sorted(
        (
            (node.start_time_ns, node.typed[1])
            for node in events(prof.profiler.kineto_results.experimental_event_tree())
            if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu"
        ),
        key=lambda pair: pair[0],
    )
    if not allocations:
        return start_bytes
    first = allocations[0][1]
    base = first.total_allocated - first.alloc_size
    return start_bytes + max(0, max(fields.total_allocated - base for _, fields in allocations))


def allocator_bounds(
    prof: Any, alive: dict[int, int], alive_after: dict[int, int], marker: str
) -> tuple[int, int]:
    """Bounds on the peak live bytes of the step marked ``record_function(marker)``, where some
    blocks are freed on threads the profiler does not cover.

    c10's CPU reporter reads the profiler's thread-local state, so a block freed on another
    thread (gloo's worker threads release collective buffers) reports no free, and
    ``total_allocated`` never comes down for it (:func:`allocator_peak` then reads high).
    The step's events are replayed from ``alive`` (address to bytes of the storages alive when
    it starts). A block counts until its reported free, or until a later allocation at its
    address (which proves it freed by then), or, when neither comes and it is not in
    ``alive_after`` (the storages alive when the step has ended), to the step's end: the high
    bound. A block freed unseen went at a time no event tells: the low bound never counts it.
    With no such block the two are equal, and equal to :func:`allocator_peak` over the step.
    Profile one step before the marked one, so that the blocks the marked step frees were
    allocated under the profiler (c10 reports no free of an older block).

    Returns:
        (low, high): the true peak lies between them.
    """
    events = [node.typed[1] for node in step_allocations(prof, marker)]
    # the blocks (start storages, then allocations by index) that end without a reported free
    owner: dict[int, Any] = {ptr: ("start", ptr) for ptr in alive}
    unseen: set[Any] = set()
    for index, fields in enumerate(events):
        if fields.alloc_size < 0:
            owner.pop(fields.ptr, None)
            continue
        if fields.ptr in owner:
            unseen.add(owner[fields.ptr])
        owner[fields.ptr] = ("event", index)
    unseen |= {key for ptr, key in owner.items() if alive_after.get(ptr) is None}
    bounds = []
    for hold in (False, True):
        live = {ptr: size for ptr, size in alive.items() if hold or ("start", ptr) not in unseen}
        total = peak = sum(live.values())
        for index, fields in enumerate(events):
            if fields.alloc_size < 0:
                total -= live.pop(fields.ptr, 0)
                continue
            total -= live.pop(fields.ptr, 0)  # reused: its earlier block was freed unseen
            if hold or ("event", index) not in unseen:
                live[fields.ptr] = fields.alloc_size
                total += fields.alloc_size
                peak = max(peak, total)
        bounds.append(peak)
    return bounds[0], bounds[1]


def step_allocations(prof: Any, marker: str) -> list[Any]:
    """The CPU allocation events (event-tree nodes; ``typed[1]`` holds the fields) from the
    first ``record_function(marker)``'s start to the profile's end, in time order.

    Raises:
        ValueError: no such ``record_function`` in the profile.
    """
    from torch._C._profiler import _EventType

    tree = prof.profiler.kineto_results.experimental_event_tree()
    marks = [node.start_time_ns for node in _walk(tree) if node.name == marker]
    if not marks:
        raise ValueError(f"no record_function {marker!r} in the profile")
    return sorted(
        (node for node in _walk(tree) if node.typed[0] == _EventType.Allocation
         and node.typed[1].device.type == "cpu" and node.start_time_ns >= min(marks)),
        key=lambda node: node.start_time_ns,
    )  # fmt: skip


def _walk(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def load_module(path: Path) -> ModuleType:
    """Import a model file as a module, the plain way."""
    spec = importlib.util.spec_from_file_location(f"_ref_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batches(module: ModuleType, batch_size: int) -> Iterator[Any]:
    if hasattr(module, "build_dataloader"):
        return iter(module.build_dataloader(batch_size))
    return (module.build_batch(batch_size) for _ in itertools.count())


def reference_step(
    path: Path,
    batch_size: int,
    *,
    grad_accum: int = 1,
    autocast: torch.dtype | None = None,
    checkpoint: bool = False,
) -> Reference:
    """Warm up one optimizer step, then profile the next one with torch's memory profiler.

    ``checkpoint`` wraps every block of the model's ``blocks`` / ``model.layers`` stack
    in ``torch.utils.checkpoint`` (non-reentrant), as a user would by hand.
    """
    module = load_module(path)
    torch.manual_seed(0)
    model = module.build_model()
    model.train()
    if checkpoint:
        _checkpoint_blocks(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    build_optimizer = getattr(module, "build_optimizer", None)
    optimizer = build_optimizer(trainable) if build_optimizer else torch.optim.AdamW(trainable)
    batches = _batches(module, batch_size)

    def loss_of(batch: Any) -> torch.Tensor:
        context = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
        with context:
            if hasattr(module, "loss_fn"):
                return module.loss_fn(model, batch)
            return model(**batch).loss

    def step() -> None:
        for _ in range(grad_accum):
            loss = loss_of(next(batches)) / grad_accum
            loss.backward()
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    keep = _state_pointers(model, optimizer)
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    reference = _peak(prof, keep)
    return Reference(reference.peak, reference.at_peak, allocator_peak(prof, sum(keep.values())))


def _checkpoint_blocks(model: torch.nn.Module) -> None:
    import functools

    from torch.utils.checkpoint import checkpoint

    stack = getattr(model, "blocks", None)
    if stack is None:
        stack = model.get_submodule("model.layers")
    for block in stack:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
