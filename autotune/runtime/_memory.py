"""Exact memory accounting of a training step: model states, saved activations, the peak."""

from __future__ import annotations

import contextlib
import functools
import statistics
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.records import AtPeak
from autotune.runtime import _device as dev
from autotune.runtime._blocks import find_block_stack, is_checkpointed

_16BIT = (torch.bfloat16, torch.float16)
# Autograd nodes that only view their input: a cast weight may be saved through them.
_VIEW_NODES = {
    "TBackward0",
    "ViewBackward0",
    "UnsafeViewBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "ExpandBackward0",
    "AsStridedBackward0",
    "SliceBackward0",
    "SelectBackward0",
    "UnsqueezeBackward0",
    "SqueezeBackward0",
    "SqueezeBackward1",
    "ReshapeAliasBackward0",
}
OTHER = "other"


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage a tensor lives in (views share it).

    The storage implementation's handle, not its data pointer: fake tensors (the
    estimate's traces) all report data pointer 0, and a resized storage keeps its
    handle while its data moves.
    """
    return int(tensor.untyped_storage()._cdata)


def unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        seen.setdefault(storage_key(tensor), tensor.untyped_storage().nbytes())
    return sum(seen.values())


def parameter_bytes(model: nn.Module) -> int:
    """All parameters, shared (tied) storages once."""
    return unique_bytes(model.parameters())


def buffer_bytes(model: nn.Module) -> int:
    """All buffers, shared storages once."""
    return unique_bytes(model.buffers())


def gradient_bytes(model: nn.Module) -> int:
    """Gradients present now (call after backward), shared storages once."""
    return unique_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in the optimizer's state, whatever the optimizer."""
    return [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Every tensor in the optimizer's state (call after one step), shared storages once."""
    return unique_bytes(optimizer_state_tensors(optimizer))


def optimizer_step_kind(optimizer: torch.optim.Optimizer) -> str | None:
    """How a torch optimizer steps its parameters, as its own step resolves it: ``fused``,
    ``foreach`` or ``single_tensor`` (its ``fused``/``foreach`` options, else torch's default
    for where the parameters are: foreach on CUDA); ``None`` for an optimizer without them."""
    defaults = getattr(optimizer, "defaults", {})
    if "foreach" not in defaults:
        return None
    if defaults.get("fused"):
        return "fused"
    if defaults["foreach"] is not None:
        return "foreach" if defaults["foreach"] else "single_tensor"
    try:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for group in optimizer.param_groups for p in group["params"]]
        _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    except (ImportError, TypeError):  # a private helper of torch's: absent, or its signature moved
        return None
    return "foreach" if foreach else "single_tensor"


def declared_step_kind(optimizer: torch.optim.Optimizer) -> str | None:
    """The step path an optimizer's own options choose (``fused``, or ``foreach`` given as
    True or False); ``None`` where they leave it to torch's default for the device the
    parameters end up on (a trace on CPU fake tensors cannot tell a GPU run's)."""
    defaults = getattr(optimizer, "defaults", {})
    if "foreach" not in defaults or (defaults["foreach"] is None and not defaults.get("fused")):
        return None
    return optimizer_step_kind(optimizer)


def is_weight_cast(tensor: torch.Tensor, max_depth: int = 4) -> bool:
    """Whether ``tensor`` is (a view of) a dtype cast of a parameter, as autocast makes."""
    if tensor.dtype not in _16BIT:
        return False
    node = tensor.grad_fn
    for _ in range(max_depth):
        if node is None:
            return False
        name = type(node).__name__
        if name == "ToCopyBackward0":
            return any(
                isinstance(getattr(nxt, "variable", None), nn.Parameter)
                for nxt, _ in node.next_functions
                if nxt is not None
            )
        if name not in _VIEW_NODES or not node.next_functions:
            return False
        node = node.next_functions[0][0]
    return False


@dataclass
class SavedTensors:
    """What one forward saved for backward (unique storages, parameters and buffers left out)."""

    activations: int = 0
    autocast_weight_copies: int = 0
    by_module: dict[str, int] = field(default_factory=dict)
    block_input: int | None = None
    """Bytes of the first tensor entering block 0 of the stack (its hidden states)."""
    keys: dict[str, set[int]] = field(default_factory=dict)
    """Storage keys by category, for :meth:`LiveTensorTracker.mark_keys` while they live."""


@contextlib.contextmanager
def count_saved_tensors(model: nn.Module) -> Iterator[SavedTensors]:
    """Count the tensors saved for backward during the forward run inside the block.

    Saved tensors are attributed to the block of the stack whose forward is
    running (else ``"other"``). A checkpointed block keeps only its inputs, held
    by the checkpoint rather than by autograd, so those are counted as its bytes.
    """
    result = SavedTensors()
    excluded = {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    current: list[str] = []
    by_module = result.by_module

    def add(tensor: torch.Tensor, module: str) -> None:
        key = storage_key(tensor)
        if key in excluded or key in seen or tensor.device.type == "meta":
            return
        seen.add(key)
        size = tensor.untyped_storage().nbytes()
        if is_weight_cast(tensor):
            result.autocast_weight_copies += size
            result.keys.setdefault("autocast_weight_copies", set()).add(key)
            return
        result.activations += size
        result.keys.setdefault("activations", set()).add(key)
        by_module[module] = by_module.get(module, 0) + size

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        add(tensor, current[-1] if current else OTHER)
        # Not the tensor itself: an op's saved output would then hold its own grad_fn, a cycle
        # through C++ that gc cannot break, and a forward never backwarded (the activation fit's)
        # kept its whole graph alive (1.7 GB after profiling GPT-2 small).
        return tensor.detach()

    handles = _block_hooks(model, current, add, result)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield result
    finally:
        for handle in handles:
            handle.remove()


def _block_hooks(
    model: nn.Module, current: list[str], add: Any, result: SavedTensors
) -> list[torch.utils.hooks.RemovableHandle]:
    found = find_block_stack(model)
    if found is None:
        return []
    path, stack = found
    handles = []
    for index, block in enumerate(stack):
        name = f"{path}.{index}"

        def pre(
            module: nn.Module, args: Any, kwargs: Any, name: str = name, index: int = index
        ) -> None:
            current.append(name)
            inputs = list(iter_tensors((args, kwargs)))
            if index == 0 and inputs:
                result.block_input = inputs[0].untyped_storage().nbytes()
            if is_checkpointed(module) and torch.is_grad_enabled():
                for tensor in inputs:
                    add(tensor, name)

        def post(module: nn.Module, args: Any, output: Any) -> None:
            current.pop()

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post))
    return handles


def iter_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in nested dicts, lists and tuples (a DTensor's local shard for the DTensor)."""
    if isinstance(value, torch.Tensor):
        # A DTensor (FSDP2's shards) is a wrapper: the memory is its local shard's.
        local = getattr(value, "_local_tensor", None)
        yield local if isinstance(local, torch.Tensor) else value
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from iter_tensors(item)


@dataclass
class _Live:
    """One live storage: its size and, once known, what it is."""

    nbytes: int
    category: str = "temporaries"
    born: int = -1
    """Index into :attr:`LiveTensorTracker.curve` of the growth that allocated it."""


WINDOW_SAVED = 0.1
"""Share of the saved activations whose freeing ends the backward's window
(:meth:`LiveTensorTracker.open_window`)."""


@dataclass
class _Window:
    """A second peak over part of the step: its bytes, the records then, and when it ends."""

    peak: int
    records: list[_Live]
    saved_left: float
    """Saved-activation bytes still to be freed before the window ends."""
    at_peak: bool = True
    ended: bool = False


class LiveTensorTracker(TorchDispatchMode):
    """Live tensor bytes on one device during a step, and what was live at their peak.

    Every storage an op creates is tracked until it is freed (a weak reference
    on the storage). Storages start as temporaries; :meth:`mark` names them once
    the caller knows what they are (saved activations after the forward,
    gradients after backward, optimizer states after the step). The snapshot at
    the peak holds the same records, so marks made later still apply to it.
    An op's output that is a view into memory from before the step (a data set
    behind ``TensorDataset``'s ``x[i]``) is not the step's and is not counted.
    Unlike ``torch.distributed._tools.mem_tracker.MemTracker`` it works with
    frozen parameters, gradient accumulation and fake tensors.

    A dispatch mode (this one, ``FakeTensorMode``) makes ATen's ``isTensorSubclassLike``
    true for every tensor, so autograd sums two gradients of one input out of place
    (``old + var``, ``torch/csrc/autograd/input_buffer.cpp``) where a plain step adds in
    place. Such a sum in the backward whose first operand is freed before any other op
    runs is counted as the plain step's in-place add: its output takes the operand's
    bytes (:meth:`_settle`). Transformers' Mamba scan sums 32 slice gradients so: +6.7 %
    before.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device_type = device.type
        self.live: dict[int, _Live] = {}
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.current = 0
        self._peak = 0
        self.peak_snapshot: list[_Live] = []
        self._at_peak = False
        self._window: _Window | None = None
        self._emptied: dict[int, str] = {}
        """Categories of storages resized to nothing, by key, for when they grow again."""
        self._pending: tuple[int, int] | None = None
        """(operand key, bytes) of a backward sum not yet counted: in place if the operand
        is freed next, else counted when the next op or free comes."""
        self.curve: list[int] = []
        """Live bytes after each growth, in order (:meth:`steady_peak` reads it)."""
        self._origin = (0, 0)
        """(growths, live bytes) when the step :meth:`steady_peak` reads began."""

    @property
    def peak(self) -> int:
        """The most live bytes seen (a pending backward sum settled first)."""
        self._settle()
        return self._peak

    def __enter__(self) -> LiveTensorTracker:
        # FSDP2 frees and re-allocates its unsharded parameters with ``UntypedStorage.resize_``
        # (``_fsdp_param.py`` free_storage / alloc_storage), a storage method no op dispatches.
        original = torch.UntypedStorage.resize_
        self._unpatched = original

        def resize_(storage: Any, size: int) -> Any:
            out = original(storage, size)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        torch.UntypedStorage.resize_ = self._unpatched  # type: ignore[method-assign]
        super().__exit__(*exc)

    def _resized(self, storage: Any) -> None:
        """A storage resized in place: its old bytes freed, its new ones (if any) allocated,
        what it was called kept across a resize to nothing and back."""
        if storage.device.type != self.device_type:
            return
        self._settle()
        key, nbytes = int(storage._cdata), storage.nbytes()
        record = self.live.get(key)
        if record is not None and record.nbytes == nbytes:
            return
        category = record.category if record else self._emptied.pop(key, "temporaries")
        if record is not None:
            self._freed(key, self._refs[key])
        if nbytes:
            self._track(storage).category = category
        else:
            self._emptied[key] = category

    def mark(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Name the storages behind ``tensors`` (tracking them if they predate the tracker)."""
        for tensor in iter_tensors(list(tensors)):
            if tensor.device.type == self.device_type:
                self._track(tensor.untyped_storage()).category = category

    def mark_keys(self, keys: Iterable[int], category: str) -> None:
        """Name live storages by :func:`storage_key` (unknown keys are not tracked: skipped)."""
        for key in keys:
            if key in self.live:
                self.live[key].category = category

    def mark_batch(self, batch: Any) -> None:
        """Track a batch that no op made in this process (DataLoader workers' shared memory).

        A tensor that is a view into a larger storage (a data set) is left out:
        that storage is not the batch.
        """
        for tensor in iter_tensors(batch):
            storage = tensor.untyped_storage()
            if tensor.device.type == self.device_type and (
                0 < storage.nbytes() <= tensor.numel() * tensor.element_size()
            ):
                self._track(storage)

    def _track(self, storage: Any, *, grow: bool = True) -> _Live:
        key = int(storage._cdata)
        record = self.live.get(key)
        if record is not None and self._refs[key]() is not storage:
            # The handle now belongs to another storage (the old one's callback is
            # pending): retire the stale record, track the new one.
            self._freed(key, self._refs[key])
            record = None
        if record is None:
            record = _Live(storage.nbytes(), born=len(self.curve))
            self.live[key] = record
            self._refs[key] = weakref.ref(storage, functools.partial(self._freed, key))
            if grow:
                self._grow(record.nbytes)
        return record

    def _grow(self, nbytes: int) -> None:
        self.current += nbytes
        self.curve.append(self.current)
        if self.current > self._peak:
            self._peak, self._at_peak = self.current, True
        window = self._window
        if window is not None and not window.ended and self.current > window.peak:
            window.peak, window.at_peak = self.current, True

    def begin(self) -> None:
        """Mark the start of the step whose :meth:`steady_peak` is wanted (after the storages
        alive before it are marked)."""
        self._settle()
        self._origin = (len(self.curve), self.current)

    def steady_peak(self) -> int:
        """The peak of the next step like this one, where this is a training run's first (from
        :meth:`begin`): the storages this step allocated and kept to its end (optimizer states
        made lazily, gradient buffers kept between steps) are alive from the start of every
        later step, so at each moment of this one those not yet allocated are added."""
        self._settle()
        since, start = self._origin
        late = [0] * (len(self.curve) + 1)
        for record in self.live.values():
            if record.born >= since:
                late[record.born] += record.nbytes
        kept_after = sum(late)  # at the step's start, every kept storage is still to come
        peak = start + kept_after
        for index in range(since, len(self.curve)):
            kept_after -= late[index]
            peak = max(peak, self.curve[index] + kept_after)
        return peak

    def open_window(self) -> None:
        """Start a second peak at the start of a backward, read by :meth:`close_window`: it
        ends once a tenth of the saved activations are freed (:data:`WINDOW_SAVED`): the loss's
        and the head's gradient buffers beside (nearly) every activation, before the layers'
        own gradients change what the moment is made of."""
        self._settle()
        saved = sum(r.nbytes for r in self.live.values() if r.category == "activations")
        self._window = _Window(self.current, list(self.live.values()), saved * WINDOW_SAVED)

    def close_window(self) -> tuple[int, AtPeak]:
        """The window's peak and the categories then (marks made later apply to them too)."""
        self._settle()
        window, self._window = self._window, None
        assert window is not None, "no window open"
        return window.peak, _parts(list(self.live.values()) if window.at_peak else window.records)

    def _settle(self) -> None:
        """Count a pending backward sum as the out-of-place add it turned out to be."""
        if self._pending is not None:
            nbytes, self._pending = self._pending[1], None
            self._grow(nbytes)

    def _freed(self, key: int, ref: object) -> None:
        if self._refs.get(key) is not ref:  # a retired record's late callback
            return
        if self._pending is not None and self._pending[0] == key:
            # The sum's operand went right after it: the plain step's in-place add, whose
            # result holds the operand's bytes. The total stays; the record goes.
            self._pending = None
            self.live.pop(key, None)
            self._refs.pop(key, None)
            return
        self._settle()
        window = self._window
        if window is not None and not window.ended:
            if window.at_peak:  # leaving the window's peak
                window.records, window.at_peak = list(self.live.values()), False
            record = self.live.get(key)
            if record is not None and record.category == "activations":
                window.saved_left -= record.nbytes
                window.ended = window.saved_left < 0
        if self._at_peak:  # leaving a peak: remember what made it up
            self.peak_snapshot, self._at_peak = list(self.live.values()), False
        record = self.live.pop(key, None)
        self._refs.pop(key, None)
        if record is not None:
            self.current -= record.nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self._settle()
        inputs = {
            int(storage._cdata): storage
            for storage in (
                tensor.untyped_storage()
                for tensor in iter_tensors((args, kwargs))
                if tensor.device.type == self.device_type
            )
        }
        out = func(*args, **(kwargs or {}))
        for key, storage in inputs.items():
            record = self.live.get(key)
            if record is not None and storage.nbytes() != record.nbytes:  # resize_, out=
                # the old size is freed and the new one allocated, as the allocator sees it
                self._freed(key, self._refs[key])
                self._track(storage).category = record.category
        summed = self._backward_sum(func, args, out)
        for tensor in iter_tensors(out):
            if tensor.device.type != self.device_type:
                continue
            storage = tensor.untyped_storage()
            key = int(storage._cdata)
            if storage.nbytes() and (key in self.live or key not in inputs):
                self._track(storage, grow=summed is None)
                if summed is not None:
                    self._pending = (summed, storage.nbytes())
        return out

    def _backward_sum(self, func: Any, args: Any, out: Any) -> int | None:
        """The first operand's key when ``out = a + b`` may be autograd's sum of gradients:
        inside a backward, grad mode off, ``a`` tracked, ``out`` a new storage of ``a``'s size."""
        if func is not torch.ops.aten.add.Tensor or torch.is_grad_enabled():
            return None
        if torch._C._current_graph_task_id() == -1:  # not inside autograd's engine
            return None
        first = args[0] if args else None
        if not isinstance(first, torch.Tensor) or not isinstance(out, torch.Tensor):
            return None
        if first.device.type != self.device_type:
            return None
        storage, made = first.untyped_storage(), out.untyped_storage()
        key = int(storage._cdata)
        if key not in self.live or int(made._cdata) in self.live:
            return None
        return key if made.nbytes() == storage.nbytes() else None

    def at_peak(self) -> AtPeak:
        """The categories live at the peak; they add up to :attr:`peak`."""
        self._settle()
        return _parts(list(self.live.values()) if self._at_peak else self.peak_snapshot)


def _parts(records: list[_Live]) -> AtPeak:
    """Bytes by category of a set of live storages."""
    parts: dict[str, int] = {}
    for record in records:
        parts[record.category] = parts.get(record.category, 0) + record.nbytes
    return AtPeak(**parts)


@dataclass(frozen=True)
class PeakResult:
    """The peak of one tracked step and what was live at that moment."""

    peak: int
    at_peak: AtPeak
    source: str
    cuda_reserved: int | None = None
    live_tensors: int | None = None
    """The tracker's own peak, where :attr:`peak` comes from c10's CPU allocator instead."""


@contextlib.contextmanager
def track_peak(
    model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> Iterator[tuple[LiveTensorTracker, list[PeakResult]]]:
    """Track live tensors during the block; yields the tracker and a list that gets the result.

    Parameters, buffers, gradients and optimizer states present at the start are
    marked; the caller marks what the step creates. On CPU the peak is the most
    live tensor bytes seen; on CUDA it is ``torch.cuda.max_memory_allocated`` and
    the allocator's excess over the tracked tensors counts as temporaries, so
    the parts still add up to the peak.
    """
    tracker = LiveTensorTracker(device)
    out: list[PeakResult] = []
    dev.reset_peak_memory(device)
    with tracker, count_rng_states(tracker):
        tracker.mark(model.parameters(), "parameters")
        tracker.mark(model.buffers(), "buffers")
        tracker.mark((p.grad for p in model.parameters() if p.grad is not None), "gradients")
        tracker.mark(optimizer_state_tensors(optimizer), "optimizer_states")
        yield tracker, out
    parts = tracker.at_peak().model_dump()
    allocator = dev.allocator_peak(device)
    if allocator is not None:
        peak, reserved = allocator
        _absorb(parts, peak - sum(parts.values()))
        out.append(PeakResult(peak, AtPeak(**parts), "cuda_max_allocated", reserved))
    else:
        out.append(PeakResult(tracker.peak, AtPeak(**parts), "cpu_live_tensors"))


@contextlib.contextmanager
def count_rng_states(tracker: LiveTensorTracker) -> Iterator[None]:
    """Count the CPU RNG states that checkpointed blocks keep for their recompute.

    ``torch.utils.checkpoint`` saves ``torch.get_rng_state()`` per checkpointed block
    (5,056 bytes on CPU) until that block's backward; the state tensor is made outside
    the dispatcher, so the tracker would not see it (torch's memory profiler does).
    """
    original = torch.get_rng_state

    def get_rng_state() -> torch.Tensor:
        state = original()
        tracker.mark([state], "activations")
        return state

    torch.get_rng_state = get_rng_state
    try:
        yield
    finally:
        torch.get_rng_state = original


def with_allocator_peak(tracked: PeakResult, allocator: int) -> PeakResult:
    """The tracked step's parts at the peak, re-based on c10's CPU allocator peak of a plain step.

    The allocator's excess over the tracked tensors (oneDNN's convolution scratch, no tensor)
    goes to temporaries, as on CUDA; a shortfall (the tracker's dispatch mode makes autograd
    accumulate gradients out of place, which a plain step does in place) comes off them.
    """
    parts = tracked.at_peak.model_dump()
    _absorb(parts, allocator - sum(parts.values()))
    return PeakResult(allocator, AtPeak(**parts), "cpu_allocator", live_tensors=tracked.peak)


def _absorb(parts: dict[str, int], excess: int) -> None:
    """Put the allocator's untracked bytes into temporaries, never below zero."""
    parts["temporaries"] += excess
    if parts["temporaries"] < 0:
        parts["activations"] = max(0, parts["activations"] + parts["temporaries"])
        parts["temporaries"] = 0


def at_peak_total(at_peak: AtPeak) -> int:
    """The sum of the parts at the peak."""
    return sum(int(value) for value in at_peak.model_dump().values())


def process_rss() -> int | None:
    """Resident set size of this process in bytes, if psutil can read it."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def block_bytes(saved: SavedTensors) -> int | None:
    """One block's saved bytes: the median block's (the first may also hold tensors all blocks
    share; blocks of unequal size, as a CNN's stages, are taken at their middle). The profile's
    fit and the trace both read it, so the two roads split the stack alike."""
    blocks = [size for name, size in saved.by_module.items() if name != OTHER]
    return int(statistics.median(blocks)) if blocks else None
