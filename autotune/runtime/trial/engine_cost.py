"""Measure what each engine's own code adds to a step on the ranks of a live process group:
DeepSpeed's or FSDP2's, on stacks of square matrices (``autotune.estimator.engine_stacks``), less
the stack's own compute and optimizer step (timed here in plain torch) and the collectives the
time model counts on the swept link (:mod:`autotune.estimator._engine_cost`).

They depend on the machine, and on the model only through its size (the wide stack's width):
a group on one machine keeps them in ``$AUTOTUNE_CACHE_DIR/engine-costs`` (default
``~/.cache/autotune``), one file per machine, package versions, world size, backend, threads
and width, and its later sweeps on a link of the same order of bandwidth measure only the
engines the file lacks (the twelve of a 2-rank CPU search take about 26 s, or 13 s for a model
of up to 2.1M parameters). Delete the file to measure them anew."""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from autotune.estimator import (
    EngineStack,
    engine_stacks,
    fit_engine_cost,
    stack_communication,
    stack_optimizer_scale,
    wide_width,
)
from autotune.estimator import stack_plan as _stack_plan
from autotune.records import AutotuneError, EngineCost, LinkMeasure, atomic_write_text

STEPS = 4
"""Timed optimizer steps on each stack, after one untimed: a second or two an engine."""

GRAD_ACCUM = 3
"""Micro-batches per step: the first two time a micro-batch, the last adds the boundary's."""

KEPT_VERSION = 1
"""Bumped when what the calibration measures changes beyond its stacks and steps (kept costs
from before are then measured anew)."""


class _Block(nn.Module):
    """``matrices`` bias-free square matrices ``width`` wide in a row."""

    def __init__(self, matrices: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(matrices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _Stack(nn.Module):
    """``blocks`` blocks of ``per_block`` matrices ``width`` wide: a block stack FSDP2 shards
    block by block."""

    def __init__(self, blocks: int, per_block: int, width: int) -> None:
        super().__init__()
        self.width = width
        self.blocks = nn.ModuleList(_Block(per_block, width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _device() -> torch.device:
    """Where the group's tensors live: the current GPU under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _phases(micro: Callable[[bool], None], steps: int) -> tuple[float, float]:
    """The slowest rank's median micro-batch and its boundary's extra seconds, over ``steps``
    optimizer steps of :data:`GRAD_ACCUM` micro-batches after one untimed step."""
    inner: list[float] = []
    last: list[float] = []
    device = _device()
    for index in range(steps + 1):
        dist.barrier()
        for j in range(GRAD_ACCUM):
            start = time.perf_counter()
            micro(j == GRAD_ACCUM - 1)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if index:
                (last if j == GRAD_ACCUM - 1 else inner).append(time.perf_counter() - start)
    one = statistics.median(inner)
    both = torch.tensor([one, statistics.median(last) - one], dtype=torch.float64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return float(both[0]), float(both[1])


def _plain(stack: EngineStack, dtype: torch.dtype, steps: int) -> tuple[float, float]:
    """The stack's own forward and backward, and its AdamW step, in plain torch."""
    model = _Stack(*stack).to(_device(), dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(1, model.width, dtype=dtype, device=_device())

    def micro(boundary: bool) -> None:
        loss = model(x).float().sum()
        loss.backward()
        float(loss)
        if boundary:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return _phases(micro, steps)


def _deepspeed(key: str, stack: EngineStack, steps: int) -> tuple[float, float]:
    from autotune.emit import emit_deepspeed_config
    from autotune.runtime.extensions import trial_deepspeed
    from autotune.runtime.trial.deepspeed_engine import _forget

    deepspeed = trial_deepspeed()
    plan = _stack_plan(key, dist.get_world_size(), GRAD_ACCUM)
    model = _Stack(*stack)
    config = emit_deepspeed_config(plan, world_size=plan.world_size,
                                   parameters=stack[0] * stack[1] * stack[2] ** 2).config  # fmt: skip
    config["zero_allow_untested_optimizer"] = True  # as a trial runs it: a torch optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    dtype = torch.bfloat16 if key.endswith("bf16") else torch.float32
    x = torch.randn(1, model.width, dtype=dtype, device=engine.device)

    def micro(boundary: bool) -> None:
        loss = engine(x).float().sum()
        engine.backward(loss)
        engine.step()
        float(loss)

    try:
        return _phases(micro, steps)
    finally:
        _forget(engine)


def _fsdp2(key: str, stack: EngineStack, steps: int) -> tuple[float, float]:
    from autotune.runtime.trial.fsdp2 import apply_fsdp2

    plan = _stack_plan(key, dist.get_world_size(), GRAD_ACCUM)
    device = _device()
    model = _Stack(*stack).to(device)
    apply_fsdp2(model, plan, device.type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(1, model.width, device=device)

    def micro(boundary: bool) -> None:
        loss = model(x).float().sum()
        (loss / GRAD_ACCUM).backward()
        float(loss)
        if boundary:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return _phases(micro, steps)


def measure(keys: Sequence[str], link: LinkMeasure, steps: int = STEPS,
            width: int = wide_width(None)) -> list[EngineCost]:  # fmt: skip
    """Each engine's own cost on these ranks (every rank must call this with the same keys).

    On each of the engine's stacks (its wide one ``width`` wide): its micro-batch and boundary
    (:func:`_phases`), less the plain stack's (timed once per stack and dtype, whichever engines
    share it; its optimizer step scaled to the rank's shard, as the time model counts it) and
    less the collectives the time model counts for the stack on ``link``; then
    :func:`autotune.estimator.fit_engine_cost` over the stacks.
    """
    costs = []
    plains: dict[tuple[EngineStack, torch.dtype], tuple[float, float]] = {}
    for key in keys:
        run: Callable[[str, EngineStack, int], tuple[float, float]] = (
            _fsdp2 if key.startswith("fsdp2") else _deepspeed
        )
        dtype = torch.bfloat16 if key.endswith("bf16") else torch.float32
        stacks = engine_stacks(key, width)
        micro, boundary = [], []
        for stack in stacks:
            torch.manual_seed(0)
            engine = run(key, stack, steps)
            if (stack, dtype) not in plains:  # the same keys on every rank: the same calls
                plains[stack, dtype] = _plain(stack, dtype, steps)
            plain = plains[stack, dtype]
            talk = stack_communication(key, *stack, link)
            micro.append(engine[0] - plain[0] - talk[0])
            share = stack_optimizer_scale(key, link.world_size)
            boundary.append(engine[1] - share * plain[1] - talk[1])
        costs.append(fit_engine_cost(key, stacks, micro, boundary, steps))
    return costs


def kept_file(link: LinkMeasure, width: int = wide_width(None)) -> Path | None:
    """The file this machine keeps the engines' costs in for a group like this one (``None``
    for a group over several machines: their costs are measured by every sweep). Its name is a
    hash of what they depend on but the link: the machine and package versions
    (:func:`autotune.runtime.identity.machine_identity`), the group's world size and backend,
    the CPUs and threads a rank has, the calibration's stacks (the wide one ``width`` wide, as
    the model's size chose it) and steps. The link is in the file (:func:`_read_kept`)."""
    from autotune.runtime.identity import machine_identity
    from autotune.runtime.trace_cache import cache_dir

    if os.environ.get("LOCAL_WORLD_SIZE") != str(link.world_size):
        return None
    machine = machine_identity("cuda" if link.backend == "nccl" else "cpu")
    stacks = {key: engine_stacks(key, width) for key in ("deepspeed-0-fp32", "fsdp2-2-fp32")}
    key = json.dumps([KEPT_VERSION, sorted(machine.items()), link.world_size, link.backend,
                      len(os.sched_getaffinity(0)), torch.get_num_threads(), stacks, STEPS,
                      GRAD_ACCUM])  # fmt: skip
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache_dir() / "engine-costs" / f"{name}.json"


KEPT_BANDWIDTH_RATIO = 2.0
"""Kept costs serve a link whose bus bandwidth is within this factor of the one they were
measured on: the collectives' time the time model counts is taken out of them, yet a link
shaped an order slower (``tc``) measures its own."""


def _read_kept(path: Path | None, link: LinkMeasure) -> dict[str, EngineCost]:
    """The costs kept in ``path`` by engine, measured on a link like ``link`` (none where the
    file is missing or unreadable, or its link's bandwidth is another order: measured anew,
    and the file written again)."""
    if path is None:
        return {}
    try:
        kept = json.loads(path.read_text())
        if abs(math.log(kept["gbps"] / link.gbps)) > math.log(KEPT_BANDWIDTH_RATIO):
            return {}
        return {cost.engine: cost for cost in map(EngineCost.model_validate, kept["engine_costs"])}
    except (OSError, ValueError, LookupError, TypeError, ZeroDivisionError):
        return {}


def _kept(path: Path | None, link: LinkMeasure) -> dict[str, EngineCost]:
    """Rank 0's kept costs, on every rank: all then measure the same engines."""
    held = [_read_kept(path, link) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(held, src=0)
    return held[0] or {}


def _keep(path: Path, link: LinkMeasure, costs: dict[str, EngineCost]) -> None:
    """Write ``costs``, measured on ``link``, to ``path`` for later sweeps (a line says where
    that failed: this sweep's costs stand)."""
    text = json.dumps({"gbps": link.gbps,
                       "engine_costs": [cost.model_dump(mode="json") for cost in costs.values()]},
                      indent=1)  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text + "\n")
    except (OSError, AutotuneError) as error:
        print(f"autotune: engines' costs not kept in {path} ({error}); later sweeps measure "
              "them again", file=sys.stderr, flush=True)  # fmt: skip


def with_engine_costs(
    link: LinkMeasure, keys: Sequence[str], parameters: int | None = None
) -> LinkMeasure:
    """``link`` with the costs of ``keys`` for a model of ``parameters`` (the wide stack's
    width: :func:`autotune.estimator.wide_width`): those this machine keeps
    (:func:`kept_file`), the rest measured (:func:`measure`) and kept; unchanged without keys,
    or where the measuring fails (a line says why: the trial's result stands without them)."""
    if not keys:
        return link
    try:
        width = wide_width(parameters)
        path = kept_file(link, width)
        kept = _kept(path, link)
        missing = [key for key in keys if key not in kept]
        measured = {cost.engine: cost for cost in measure(missing, link, width=width)}
        if measured and path is not None and dist.get_rank() == 0:
            _keep(path, link, {**kept, **measured})
        return link.model_copy(update={
            "engine_costs": [measured.get(key) or kept[key] for key in keys],
            "engine_costs_kept": [key for key in keys if key not in measured],
            "engine_costs_file": str(path) if path is not None else None})  # fmt: skip
    except Exception as error:  # the same code on every rank: all get here
        print(f"autotune: engines' own costs not measured ({type(error).__name__}: {error}); "
              "the trial stands without them", file=sys.stderr, flush=True)  # fmt: skip
        return link
