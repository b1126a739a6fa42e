"""A trial on a DeepSpeed engine (ZeRO plans, 16-bit weights, several ranks), and what a worker
that runs the next trial must drop of it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from autotune.records import TrialResult, WorkerSpec
from autotune.runtime.trial.steps import (
    Steps,
    cuda_peak,
    live_peak,
    load_cached,
    ranks,
    tensors_on,
)


def _cast_floats(batch: Any, dtype: Any) -> Any:
    """16-bit-weight engines need floating inputs in the weights' dtype."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {key: _cast_floats(value, dtype) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_cast_floats(value, dtype) for value in batch)
    return batch


def deepspeed_trial(spec: WorkerSpec, steps: Steps) -> dict[str, Any]:
    import torch

    from autotune.emit import emit_deepspeed_config
    from autotune.runtime._blocks import apply_checkpointing
    from autotune.runtime._device import synchronize
    from autotune.runtime.extensions import trial_deepspeed

    deepspeed = trial_deepspeed()

    plan = spec.plan
    model_file = load_cached(spec.settings.model_file)
    steps.watch.rebase()
    torch.manual_seed(spec.settings.seed)
    model = model_file.build_model()
    apply_checkpointing(model, plan.checkpoint_blocks)
    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
    parameters = sum(p.numel() for p in model.parameters())
    # deepspeed.initialize parses it with DeepSpeed's own config class just below.
    config = emit_deepspeed_config(plan, world_size=ranks()[1], parameters=parameters).config
    # A torch client optimizer avoids compiling DeepSpeed's own (60-75 s per trial shape).
    config["zero_allow_untested_optimizer"] = True
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    batches = model_file.batches(plan.micro_batch, workers=plan.dataloader_workers or None)
    weights = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    amp = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(plan.precision)
    last: list[Any] = [None]

    def micro() -> float:
        batch = next(batches)
        last[0] = batch
        batch = model_file.move(batch, engine.device)
        if weights is not None:
            batch = _cast_floats(batch, weights)
        autocast = (
            torch.autocast(engine.device.type, dtype=amp) if amp else contextlib.nullcontext()
        )
        with autocast:
            loss = model_file.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        return float(loss.detach().float())

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        loss = sum(micro() for _ in range(plan.grad_accum)) / plan.grad_accum
        synchronize(engine.device)
        return time.perf_counter() - start, loss

    # The engine's flat buffers and partitions are not all reachable from the model or
    # the optimizer, so everything alive on the device counts as present at the start. ZeRO-3's
    # first step records the modules' order and prefetches nothing, so it is not a later step
    # less what it kept (bench/peak_step.py: -2.6 % to +14.7 % on tiny Llama): an extra step.
    steps.run(step, peak_on=engine.device if plan.zero_stage < 3 else None)
    cuda = cuda_peak(engine.device)
    live = steps.peak
    if live is None and spec.settings.measure_peak and cuda is None:
        # no warm-up step was tracked; a GPU's allocator gave the timed steps' peak
        live = live_peak(engine.device, tensors_on(engine.device), step)
    tokens = model_file.tokens_per_sample(last[0])
    device = engine.device
    batches.close()
    _forget(engine)
    return {"split": None, "tokens": tokens, "device": device, "engine": "deepspeed",
            "live": live, "cuda": cuda, "parameters": parameters}  # fmt: skip


def _forget(engine: Any) -> None:
    """Drop every reference DeepSpeed keeps to a finished engine, so a worker that runs
    the next trial holds none of this one's tensors (its peak would count them).
    """
    with contextlib.suppress(Exception):
        engine.destroy()  # hooks, ZeRO partitions
    # ZeRO-3 pushes each module on a module-level stack in its forward pre-hook and pops it
    # in the post-hook (DeepSpeed 0.19, parameter_offload.py:537, 366). The top module is
    # never popped, nor are the blocks a checkpointed recompute enters: torch stops that
    # recompute early, before their post-hooks. One trial runs at a time, so the whole
    # stack is this engine's (kept, it held the engine and its tensors into every later
    # trial of a reused worker: +1.13 MB a trial on bert).
    from deepspeed.runtime.zero import parameter_offload

    stack = getattr(parameter_offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        stack.clear()
    # ... and caches a method per coordinator instance in a class-level lru_cache.
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator

    for value in vars(coordinator.PartitionedParameterCoordinator).values():
        _clear_caches(value)


def _clear_caches(fn: Any, depth: int = 3) -> None:
    """``cache_clear()`` every lru_cache inside ``fn``'s wrappers (``__wrapped__`` or closures)."""
    if depth < 0 or fn is None:
        return
    clear = getattr(fn, "cache_clear", None)
    if callable(clear):
        clear()
    inner = [getattr(fn, "__wrapped__", None)]
    inner += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
              if callable(getattr(cell, "cell_contents", None))]  # fmt: skip
    for wrapped in inner:
        _clear_caches(wrapped, depth - 1)


def warm_launcher(spec: WorkerSpec) -> TrialResult:
    """Start DeepSpeed once on a throw-away model: its imports and its communication backend
    (without the CPU comm op no trial uses: :func:`autotune.runtime.extensions.trial_deepspeed`).

    A plan that needs no DeepSpeed only imports torch (a live worker keeps it imported).
    """
    import torch

    world = ranks()[1]
    if not (spec.plan.uses_deepspeed or world > 1):
        return TrialResult(engine="none")
    from autotune.runtime.extensions import trial_deepspeed

    deepspeed = trial_deepspeed()
    model = torch.nn.Linear(4, 4)
    config = {
        "train_batch_size": world,
        "train_micro_batch_size_per_gpu": 1,
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    _forget(engine)
    return TrialResult(engine="deepspeed")
