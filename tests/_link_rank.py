"""One rank of the shaped-link job: a link sweep, then DeepSpeed steps with the link shaped and
open in turn; run by torchrun inside the test's network namespace (one rank per "node").

``python -m torch.distributed.run ... tests/_link_rank.py OUT.json RATE PLAN...`` where each
PLAN is ``NAME=KNOBS`` (``+release``: DeepSpeed told to release every parameter after its use,
as it does a model past 1e9 elements). Rank 0 shapes the namespace's loopback with ``tc`` tbf at
RATE between windows (both ranks share it) and writes a JSON of the sweeps, the step times of
each window and the collectives counted per step.
"""

from __future__ import annotations

import collections
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

WIDTH = 512
BLOCKS = 4
BATCH = 4
ROUNDS = 9
STEPS = 2
"""Optimizer steps per timed window; windows alternate shaped/open, ROUNDS pairs per plan."""
COUNTED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather",
           "reduce_scatter", "reduce", "broadcast")  # fmt: skip
CALLS: collections.Counter[str] = collections.Counter()
BYTES: collections.Counter[str] = collections.Counter()


def _count(name: str) -> None:
    """Count calls and bytes (the largest tensor argument) of ``torch.distributed.<name>``:
    patched before DeepSpeed binds the functions."""
    real = getattr(dist, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        CALLS[name] += 1
        BYTES[name] += max((t.numel() * t.element_size() for t in tensors), default=0)
        return real(*args, **kwargs)

    setattr(dist, name, counted)


for _name in COUNTED:
    _count(_name)

import deepspeed  # noqa: E402  (after the counting patch)

from autotune.emit import emit_deepspeed_config  # noqa: E402
from autotune.records import parse_plan  # noqa: E402
from autotune.runtime.link import sweep  # noqa: E402


def model() -> nn.Module:
    """Blocks of Linear(512, 512): each weight above ZeRO-3's persistence threshold (100k)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


def shape(rate: str | None) -> None:
    """Rank 0 shapes (or opens) the namespace's loopback; every rank waits for it."""
    if dist.get_rank() == 0:
        command = ["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate,
                   "burst", "128kb", "latency", "50ms"] if rate else [
                   "tc", "qdisc", "del", "dev", "lo", "root"]  # fmt: skip
        subprocess.run(command, check=rate is not None, capture_output=True, timeout=10)
    dist.barrier()


def window(engine: Any, steps: int) -> float:
    """Seconds per optimizer step over ``steps`` steps, the slowest rank's."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(BATCH, WIDTH)
            engine.backward(engine(x).pow(2).mean())
            engine.step()
    took = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def run_plan(knobs: str, rate: str) -> dict[str, Any]:
    """Shaped and open windows of one plan, interleaved, and its collectives per step."""
    knobs, _, release = knobs.partition("+")
    config = emit_deepspeed_config(parse_plan(f"{knobs},nproc_per_node=1,nnodes=2")).config
    if release:
        config["zero_optimization"].update(stage3_max_reuse_distance=0,
                                           stage3_max_live_parameters=0,
                                           stage3_prefetch_bucket_size=0)  # fmt: skip
    net = model()
    with contextlib.redirect_stdout(sys.stderr):
        engine, *_ = deepspeed.initialize(
            model=net, optimizer=torch.optim.AdamW(net.parameters()), config=config
        )
    window(engine, 2)  # warm-up: ZeRO-3 traces its fetch order in the first step
    CALLS.clear()
    BYTES.clear()
    window(engine, 1)
    calls = {name: (CALLS[name], BYTES[name]) for name in CALLS}
    shaped, open_ = [], []
    for _ in range(ROUNDS):
        shape(rate)
        shaped.append(window(engine, STEPS))
        shape(None)
        open_.append(window(engine, STEPS))
    engine.destroy()
    return {"shaped": shaped, "open": open_, "calls": calls}


def main(out: str, rate: str, plans: list[str]) -> None:
    """Sweep the link shaped and open, then time each plan; rank 0 writes the results."""
    deepspeed.init_distributed(dist_backend="gloo")
    shape(rate)
    shaped = sweep()
    shape(None)
    open_ = sweep()
    results: dict[str, Any] = {
        "sweep_shaped": shaped.model_dump(),
        "sweep_open": open_.model_dump(),
    }
    sizes = [p.numel() for p in model().parameters()]
    results.update(parameters=sum(sizes), parameter_sizes=sizes, plans={})
    for entry in plans:
        name, _, knobs = entry.partition("=")
        results["plans"][name] = {"knobs": knobs, **run_plan(knobs, rate)}
        if dist.get_rank() == 0:
            print(name, {k: statistics.median(v) for k, v in results["plans"][name].items()
                         if k in ("shaped", "open")}, file=sys.stderr, flush=True)  # fmt: skip
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()  # a gloo group alive at exit can abort the process


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
