"""One rank of ``bench/zero_peaks.py``: each plan's engine, warm-up steps, then the in-rank reference.

Run by ``torch.distributed.run`` (``zero_peaks.py --rank-worker JOB OUT``). The reference is
torch's own instrument inside the rank, the same for DeepSpeed and FSDP2:

- CPU: the bytes alive when the measured step starts, then c10's CPU allocation events of that
  step replayed (``tests/_reference.py::allocator_bounds``, from the profiler's allocation
  events, ``profile_memory=True`` only). The bytes alive are every CPU tensor storage the
  garbage collector reaches then (parameters, gradients, optimizer states, DeepSpeed's flat
  buffers and partitions, FSDP2's shards, buffers and caches of the model), once per storage,
  less the storages alive before the plan's model was built (an earlier plan's, in the same
  ranks). The window holds one step before the measured one, so the measured step's frees of
  the previous step's blocks are seen. c10 reports no free made on a thread the profiler does
  not cover (gloo's worker threads release collective buffers): such a block, when nothing
  proves when it went, gives a low and a high bound (``low`` and ``reference``); without one
  the two are equal, and equal to ``allocator_peak`` (c10's ``total_allocated``).
- CUDA: ``torch.cuda.max_memory_allocated`` over the measured step (peak reset before it),
  less what was allocated before the plan's model was built.

With ``categories`` the same CPU window is also recorded with shapes and stacks, and torch's
categorised memory timeline (``tests/_reference.py::_peak``) gives its peak and the bytes by
category then, where its data-flow analysis holds (it asserts on FSDP2 steps).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import sys
from pathlib import Path
from typing import Any

MARKER = "zero_peaks.measured_step"
WARMUP = 3
"""Steps before the profiled window: stage 3 traces its parameter order over the first two
and only then keeps gathered parameters for their reuse (its steady state)."""


def _step(model_file: Any, engine: Any, batches: Any, grad_accum: int) -> None:
    """One optimizer step of a DeepSpeed engine: ``grad_accum`` micro-batches, each phase
    marked for :func:`named_at_peak`."""
    from torch.profiler import record_function

    for _ in range(grad_accum):
        batch = model_file.move(next(batches), engine.device)
        with record_function("forward"):
            loss = model_file.loss(engine, batch)
        with record_function("backward"):
            engine.backward(loss)
        with record_function("engine.step"):
            engine.step()
        del loss, batch


def storages(device: str = "cpu") -> dict[int, int]:
    """Every tensor storage the garbage collector reaches on ``device``: address to bytes.

    A DTensor counts as its local shard; views share their base's address, so each storage
    counts once; a storage resized to nothing (FSDP2's unsharded parameters between uses)
    counts nothing.
    """
    import torch
    from torch.distributed.tensor import DTensor

    found = {}
    for obj in gc.get_objects():
        if isinstance(obj, DTensor):
            obj = obj._local_tensor
        if isinstance(obj, torch.Tensor) and obj.device.type == device:
            storage = obj.untyped_storage()
            if storage.nbytes():
                found[storage.data_ptr()] = storage.nbytes()
    return found


def _engine(model_file: Any, plan: Any, world: int, device: str) -> tuple[Any, Any]:
    """The plan's engine (DeepSpeed or ``fully_shard``) and its optimizer step."""
    import deepspeed
    import torch

    from autotune.emit import emit_deepspeed_config
    from autotune.runtime._blocks import apply_checkpointing

    torch.manual_seed(0)
    model = model_file.build_model()
    apply_checkpointing(model, plan.checkpoint_blocks)
    batches = model_file.batches(plan.micro_batch)
    if plan.engine == "fsdp2":
        from autotune.runtime.trial.fsdp2 import apply_fsdp2, fsdp2_step

        model.to(device)
        apply_fsdp2(model, plan, device)
        optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])

        def loss_of() -> Any:
            return model_file.loss(model, model_file.move(next(batches), device))

        return model, fsdp2_step(model, optimizer, loss_of, plan)
    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
    parameters = sum(p.numel() for p in model.parameters())
    config = emit_deepspeed_config(plan, world_size=world, parameters=parameters).config
    with contextlib.redirect_stdout(sys.stderr):
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, functools.partial(_step, model_file, engine, batches, plan.grad_accum)


def named_at_peak(prof: Any, alive: dict[int, int], marker: str, top: int = 8) -> list[Any]:
    """The blocks live at the marked step's peak (the high bound's replay), in MiB by what
    allocated them: the op chain over each allocation event, innermost first (``start``: alive
    when the step began). How the causes in bench/RESULTS.md were named."""
    from _reference import step_allocations

    events = step_allocations(prof, marker)
    total = peak = sum(alive.values())
    at_peak = -1  # the index of the event the peak follows (-1: the step's start)
    live = dict(alive)
    for index, node in enumerate(events):
        fields = node.typed[1]
        total -= live.pop(fields.ptr, 0)
        if fields.alloc_size > 0:
            live[fields.ptr] = fields.alloc_size
            total += fields.alloc_size
            if total > peak:
                peak, at_peak = total, index
    snapshot = {ptr: (size, "start") for ptr, size in alive.items()}
    for node in events[: at_peak + 1]:  # again to the peak, naming each block by its ops
        fields = node.typed[1]
        snapshot.pop(fields.ptr, None)
        if fields.alloc_size > 0:
            chain, parent = [], node.parent
            while parent is not None and parent.name != marker and len(chain) < 4:
                chain.append(parent.name)
                parent = parent.parent
            snapshot[fields.ptr] = (fields.alloc_size, " < ".join(chain) or "?")
    groups: dict[str, int] = {}
    for size, name in snapshot.values():
        groups[name] = groups.get(name, 0) + size
    ranked = sorted(groups.items(), key=lambda item: -item[1])[:top]
    return [[round(size / 2**20, 2), name] for name, size in ranked if size]


def _measure_cpu(step: Any, before: dict[int, int], categories: bool) -> dict[str, Any]:
    """The allocator reference of one step (after one more in the window), and the timeline's."""
    from _reference import _peak, allocator_bounds
    from torch.profiler import ProfilerActivity, profile, record_function

    gc.collect()
    keep = {ptr: size for ptr, size in storages().items() if ptr not in before}
    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=categories,
        with_stack=categories,
    ) as prof:
        step()
        gc.collect()
        alive = {ptr: size for ptr, size in storages().items() if ptr not in before}
        with record_function(MARKER):
            step()
        gc.collect()
        after = {ptr: size for ptr, size in storages().items() if ptr not in before}
    low, high = allocator_bounds(prof, alive, after, MARKER)
    measured: dict[str, Any] = {
        "reference": high,
        "low": low,
        "start": sum(alive.values()),
        "timeline": None,
        "at_peak": {},
        "named": named_at_peak(prof, alive, MARKER),
    }
    if categories:
        try:
            timeline = _peak(prof, keep)
            measured["timeline"], measured["at_peak"] = timeline.peak, timeline.at_peak
        except AssertionError as exc:  # torch's data-flow analysis ("version mismatch", ...)
            measured["at_peak"] = {"timeline failed": str(exc)[:80]}
    return measured


def _measure_cuda(step: Any, before: int) -> dict[str, Any]:
    """``torch.cuda.max_memory_allocated`` over one step after one more, less ``before`` (the
    bytes allocated before the plan's model was built: an earlier plan's, in the same ranks)."""
    import torch

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    return {"reference": peak, "low": peak, "start": None, "timeline": None, "at_peak": {}}


def rank_main(job_path: str, out_path: str) -> None:
    """One rank: every plan of the job in turn; rank 0 writes every rank's figures."""
    import torch
    import torch.distributed as dist

    from autotune.records import Plan
    from autotune.runtime.extensions import trial_deepspeed
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.trial.steps import leave_ranks

    job = json.loads(Path(job_path).read_text())
    device = job.get("device", "cpu")
    model_file = load_model_file(job["model"])
    deepspeed = trial_deepspeed()  # as a trial: no shared-memory comm op built (or its lock)
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    results = []
    for text in job["plans"]:
        plan = Plan.model_validate_json(text)
        gc.collect()
        if device == "cpu":
            before = storages()
        else:
            torch.cuda.empty_cache()
            allocated = torch.cuda.memory_allocated()
        engine, step = _engine(model_file, plan, world, device)
        for _ in range(WARMUP):
            step()
        if device == "cpu":
            results.append(_measure_cpu(step, before, job.get("categories", False)))
        else:
            results.append(_measure_cuda(step, allocated))
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine, step
        gc.collect()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    # Torn down here, not at interpreter exit: a rank whose gloo group outlives its peer's
    # exit can abort (SIGABRT) in the group's destructor.
    leave_ranks()
