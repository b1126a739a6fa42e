"""The model's repeated block stack, and activation checkpointing of its first blocks."""

from __future__ import annotations

import functools
import time
from typing import Any

import torch.utils.checkpoint
from torch import nn

from autotune.records import AutotuneError
from autotune.runtime._device import synchronize

_ORIGINAL = "_autotune_original_forward"


def unique_parameter_count(module: nn.Module) -> int:
    """Parameters of ``module``, each shared storage counted once."""
    seen: set[int] = set()
    total = 0
    for param in module.parameters():
        key = param.untyped_storage().data_ptr() if param.device.type != "meta" else id(param)
        if key not in seen:
            seen.add(key)
            total += param.numel()
    return total


def find_block_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """The largest ``nn.ModuleList`` of >= 2 blocks of one class, by parameter count.

    Returns:
        ``(dotted path, module list)``, or ``None`` when the model has no such stack.
    """
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(block) for block in module}) != 1:
            continue
        params = unique_parameter_count(module)
        if best is None or params > best[0]:
            best = (params, name, module)
    return None if best is None else (best[1], best[2])


class BlockClock:
    """Seconds a forward pass spends in the model's block stack: from the first block's call to
    the last one's return (the device synchronized at both), summed until :meth:`take`. A
    checkpointed block's recompute in the backward is not counted (it calls the block's own
    forward, past these hooks; and the hooks skip anything run inside a backward). With no block
    stack it counts nothing, and :meth:`take` says so."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0
        self._started: float | None = None
        found = find_block_stack(model)
        self._handles = (
            [
                found[1][0].register_forward_pre_hook(self._start),
                found[1][-1].register_forward_hook(self._stop),
            ]
            if found is not None
            else []
        )

    def _start(self, *_: Any) -> None:
        if torch._C._current_graph_task_id() == -1:  # not inside a backward
            synchronize(self.device)
            self._started = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        if self._started is not None:
            synchronize(self.device)
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def take(self) -> float | None:
        """The seconds counted since the last take, the count started again; ``None`` where the
        model has no block stack (or the clock is closed)."""
        seconds, self.seconds, self._started = self.seconds, 0.0, None
        return seconds if self._handles else None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def apply_checkpointing(model: nn.Module, blocks: int) -> None:
    """Checkpoint the first ``blocks`` blocks of the stack (non-reentrant); undo the rest.

    Calling it again with another number re-applies from scratch, so it can be
    used to switch granularity on one model.

    Raises:
        AutotuneError: ``blocks`` > 0 and there is no stack, or more than L blocks.
    """
    found = find_block_stack(model)
    if found is None:
        if blocks > 0:
            raise AutotuneError(
                "checkpointing: the model has no repeated block stack (an nn.ModuleList of "
                ">= 2 blocks of one class) to checkpoint"
            )
        return
    path, stack = found
    if blocks < 0 or blocks > len(stack):
        raise AutotuneError(
            f"checkpointing: {blocks} blocks asked, the stack {path} has {len(stack)}"
        )
    for index, block in enumerate(stack):
        _unwrap(block)
        if index < blocks:
            _wrap(block)


def checkpointed_blocks(model: nn.Module) -> int:
    """How many blocks of the stack are wrapped by :func:`apply_checkpointing`."""
    found = find_block_stack(model)
    if found is None:
        return 0
    return sum(1 for block in found[1] if is_checkpointed(block))


def is_checkpointed(block: nn.Module) -> bool:
    """Whether :func:`apply_checkpointing` wrapped this block."""
    return _ORIGINAL in block.__dict__


def _wrap(block: nn.Module) -> None:
    original = block.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, **kwargs)

    block.__dict__[_ORIGINAL] = original
    block.forward = forward  # type: ignore[method-assign]


def _unwrap(block: nn.Module) -> None:
    original = block.__dict__.pop(_ORIGINAL, None)
    if original is not None:
        del block.forward
