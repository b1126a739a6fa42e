"""FSDP2 (``torch.distributed.fsdp.fully_shard``) applied to a model as an ``engine=fsdp2`` plan says.

The same calls ``autotune.emit.fsdp2_code`` prints for the user: ``fully_shard`` on every
block of the repeated stack, then on the root (PyTorch's default for the root: not resharded
after forward), with the plan's ``MixedPrecisionPolicy`` and ``CPUOffloadPolicy``.
Runs on CPU with gloo (torch 2.13; ``CPUOffloadPolicy(pin_memory=False)`` there, since
pinning needs an accelerator) and on CUDA with NCCL.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autotune.records import AutotuneError, Plan
from autotune.runtime.blocks import find_block_stack


def fsdp2_policies(plan: Plan, device_type: str) -> dict[str, Any]:
    """The keyword arguments every ``fully_shard`` call of the plan takes."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {}
    if plan.precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if plan.offload_param == "cpu":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type != "cpu")
    return kwargs


def apply_fsdp2(model: nn.Module, plan: Plan, device_type: str = "cpu") -> int:
    """Shard ``model`` in place: each block of its stack, then the root. Returns the blocks sharded.

    Needs an initialised default process group.

    Raises:
        AutotuneError: the plan is not ``engine=fsdp2``.
    """
    from torch.distributed.fsdp import fully_shard

    if plan.engine != "fsdp2":
        raise AutotuneError(f"apply_fsdp2: plan {plan.describe()} is not engine=fsdp2")
    kwargs = fsdp2_policies(plan, device_type)
    found = find_block_stack(model)
    blocks = list(found[1]) if found else []
    for block in blocks:
        fully_shard(block, reshard_after_forward=plan.reshard_after_forward, **kwargs)
    fully_shard(model, **kwargs)
    return len(blocks)


def fsdp2_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_of: Callable[[], torch.Tensor],
    plan: Plan,
) -> Callable[[], tuple[float, float]]:
    """One optimizer step of ``plan.grad_accum`` micro-batches: returns (seconds, mean loss).

    Autocast applies under ``precision=amp_bf16``; under ``bf16`` the policy casts instead.
    """
    device_type = "cuda" if torch.cuda.is_available() else "cpu"

    def step() -> tuple[float, float]:
        start, total = time.perf_counter(), 0.0
        for _ in range(plan.grad_accum):
            autocast = (
                torch.autocast(device_type, dtype=torch.bfloat16)
                if plan.precision == "amp_bf16"
                else contextlib.nullcontext()
            )
            with autocast:
                loss = loss_of()
            (loss.float() / plan.grad_accum).backward()
            total += float(loss.detach().float())
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, total / plan.grad_accum

    return step
