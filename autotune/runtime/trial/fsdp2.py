"""FSDP2 (``torch.distributed.fsdp.fully_shard``) applied to a model as an ``engine=fsdp2`` plan says.

The same calls ``autotune.emit.fsdp2_code`` prints for the user: ``fully_shard`` on every
block of the repeated stack, then on the root (PyTorch's default for the root: not resharded
after forward), with the plan's ``MixedPrecisionPolicy`` and ``CPUOffloadPolicy``.
Runs on CPU with gloo (torch 2.13; ``CPUOffloadPolicy(pin_memory=False)`` there, since
pinning needs an accelerator) and on CUDA with NCCL.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autotune.records import AutotuneError, Plan
from autotune.runtime._blocks import find_block_stack


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


def _init_group(device_type: str) -> None:
    """The default process group from torchrun's (or the trial runner's) environment."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")


def fsdp2_trial(
    spec: Any, steps: Any, live_peak: Callable[[torch.device, Callable[[], object]], int | None]
) -> dict[str, Any]:
    """An ``engine=fsdp2`` trial inside one rank: shard, run the spec's steps, measure.

    ``steps`` is the trial worker's step loop (warm-up, timed steps, progress);
    ``live_peak(device, step)`` is its live-tensor measure of one more, untimed step (``None``:
    not measured, the spec's ``measure_peak`` off), taken only where neither the warm-up step
    (``steps.peak``) nor a GPU's allocator gave the peak.
    Returns the trial worker's info dict (``engine: fsdp2``).
    """
    from autotune.runtime import _device as dev
    from autotune.runtime._blocks import apply_checkpointing
    from autotune.runtime._device import synchronize
    from autotune.runtime.modelfile import load_model_file

    plan, settings = spec.plan, spec.settings
    device = torch.device(settings.device)
    if device.type == "cuda":  # one GPU per rank, as torchrun numbers them
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    _init_group(device.type)
    model_file = load_model_file(settings.model_file)
    steps.watch.rebase()
    torch.manual_seed(settings.seed)
    model = model_file.build_model().to(device)
    apply_checkpointing(model, plan.checkpoint_blocks)
    parameters = sum(p.numel() for p in model.parameters())
    apply_fsdp2(model, plan, device.type)
    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
    batches = model_file.batches(plan.micro_batch, workers=plan.dataloader_workers or None)
    last: list[Any] = [None]

    def loss_of() -> torch.Tensor:
        last[0] = next(batches)
        return model_file.loss(model, model_file.move(last[0], device))  # type: ignore[no-any-return]

    one = fsdp2_step(model, optimizer, loss_of, plan)

    def step() -> tuple[float, float]:
        seconds, loss = one()
        synchronize(device)
        return seconds, loss

    steps.run(step, peak_on=device)
    peaks = dev.allocator_peak(device)
    cuda = None if peaks is None else peaks[0]
    live = steps.peak
    if live is None and cuda is None:  # no warm-up step tracked; a GPU's allocator gave it
        live = live_peak(device, step)
    return {"split": None, "tokens": model_file.tokens_per_sample(last[0]), "device": device,
            "engine": "fsdp2", "live": live, "cuda": cuda, "parameters": parameters}  # fmt: skip
