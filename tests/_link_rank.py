"""One rank of the shaped-link job: a link sweep, then DeepSpeed or FSDP2 steps with the link
shaped and open in turn; run by torchrun inside the job's network namespace (one rank per "node",
``_link_job.run_job``).

``python -m torch.distributed.run ... tests/_link_rank.py OUT.json RATE [--rounds N]
[--sweep-tries N] PLAN...``
where each PLAN is ``NAME=KNOBS`` (``+release``: DeepSpeed told to release every parameter after
its use, as it does a model past 1e9 elements; ``engine=fsdp2``: ``fully_shard`` as autotune's
trials apply it, ``autotune.runtime.trial.fsdp2``). Rank 0 shapes the namespace's loopback with
``tc`` tbf at RATE between windows (both ranks share it) and writes a JSON of the sweeps (the
shaped link's before and after the windows), the step times of each window and the collectives
counted per step.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
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
           "reduce_scatter", "reduce", "broadcast",
           # FSDP2 calls these (torch 2.13); DeepSpeed's *_tensor reach them inside c10d, uncounted
           "all_gather_single", "reduce_scatter_single")  # fmt: skip
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
from autotune.records import LinkMeasure, Plan, parse_plan  # noqa: E402
from autotune.runtime.link import sweep  # noqa: E402
from autotune.runtime.trial.fsdp2 import apply_fsdp2, fsdp2_step  # noqa: E402


def model() -> nn.Module:
    """Blocks of Linear(512, 512): each weight above ZeRO-3's persistence threshold (100k)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 1))


class Stack(nn.Module):
    """:func:`model`'s parameters, in the same order and values, as a block stack (an
    ``nn.ModuleList``): what FSDP2 plans shard one block at a time."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(BLOCKS)
        )
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


def shape(rate: str | None) -> None:
    """Rank 0 shapes (or opens) the namespace's loopback; every rank waits for it."""
    if dist.get_rank() == 0:
        command = ["tc", "qdisc", "replace", "dev", "lo", "root", "tbf", "rate", rate,
                   "burst", "128kb", "latency", "50ms"] if rate else [
                   "tc", "qdisc", "del", "dev", "lo", "root"]  # fmt: skip
        subprocess.run(command, check=rate is not None, capture_output=True, timeout=10)
    dist.barrier()


def window(step: Callable[[], object], steps: int) -> float:
    """Seconds per optimizer step over ``steps`` steps, the slowest rank's."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    took = torch.tensor([(time.perf_counter() - start) / steps], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def deepspeed_run(plan: Plan, release: bool) -> tuple[Callable[[], object], Callable[[], None]]:
    """One optimizer step of a DeepSpeed engine of ``plan`` on :func:`model`, and its close."""
    config = emit_deepspeed_config(plan).config
    if release:
        config["zero_optimization"].update(stage3_max_reuse_distance=0,
                                           stage3_max_live_parameters=0,
                                           stage3_prefetch_bucket_size=0)  # fmt: skip
    net = model()
    with contextlib.redirect_stdout(sys.stderr):
        engine, *_ = deepspeed.initialize(
            model=net, optimizer=torch.optim.AdamW(net.parameters()), config=config
        )

    def step() -> None:
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(BATCH, WIDTH)
            engine.backward(engine(x).pow(2).mean())
            engine.step()

    return step, engine.destroy


def fsdp2_run(plan: Plan) -> tuple[Callable[[], object], Callable[[], None]]:
    """One optimizer step of :class:`Stack` sharded as autotune's FSDP2 trials shard it
    (``fully_shard`` per block, then the root), and its close (nothing to close)."""
    net = Stack()
    apply_fsdp2(net, plan, "cpu")
    one = fsdp2_step(net, torch.optim.AdamW(net.parameters()),
                     lambda: net(torch.randn(BATCH, WIDTH)).pow(2).mean(), plan)  # fmt: skip
    return one, lambda: None


def run_plan(knobs: str, rate: str, rounds: int = ROUNDS) -> dict[str, Any]:
    """Shaped and open windows of one plan, interleaved, and its collectives per step."""
    knobs, _, release = knobs.partition("+")
    plan = parse_plan(f"{knobs},nproc_per_node=1,nnodes=2")
    step, close = fsdp2_run(plan) if plan.engine == "fsdp2" else deepspeed_run(plan, bool(release))
    window(step, 2)  # warm-up: ZeRO-3 traces its fetch order in the first step
    CALLS.clear()
    BYTES.clear()
    window(step, 1)
    calls = {name: (CALLS[name], BYTES[name]) for name in CALLS}
    shaped, open_ = [], []
    for _ in range(rounds):
        shape(rate)
        shaped.append(window(step, STEPS))
        shape(None)
        open_.append(window(step, STEPS))
    close()
    return {"shaped": shaped, "open": open_, "calls": calls}


def swept(tries: int, failures: list[str]) -> LinkMeasure:
    """The link swept, swept again (up to ``tries`` sweeps in all) where the fit refuses its
    points: the open loopback is so fast that under noise a collective's times can fail to grow
    with size. Each refusal is appended to ``failures``; every rank sees the same points."""
    for attempt in range(1, tries + 1):
        try:
            return sweep()
        except ValueError as error:
            failures.append(str(error))
            if attempt == tries:
                raise
    raise ValueError(f"tries: must be >= 1 (got {tries})")


def main(out: str, rate: str, plans: list[str], rounds: int = ROUNDS, sweep_tries: int = 1) -> None:
    """Sweep the link shaped and open, time each plan, sweep it shaped again; rank 0 writes
    the results."""
    deepspeed.init_distributed(dist_backend="gloo")
    failures: dict[str, list[str]] = {"shaped": [], "open": []}
    shape(rate)
    shaped = swept(sweep_tries, failures["shaped"])
    shape(None)
    open_ = swept(sweep_tries, failures["open"])
    results: dict[str, Any] = {
        "sweep_shaped": shaped.model_dump(),
        "sweep_open": open_.model_dump(),
        "sweep_failures": failures,
    }
    sizes = [p.numel() for p in model().parameters()]
    results.update(
        parameters=sum(sizes),
        parameter_sizes=sizes,
        plans={},
        blocks=BLOCKS,
        block_parameters=WIDTH * WIDTH + WIDTH,
    )  # :class:`Stack`'s, as FSDP2 shards it
    for entry in plans:
        name, _, knobs = entry.partition("=")
        results["plans"][name] = {"knobs": knobs, **run_plan(knobs, rate, rounds)}
        if dist.get_rank() == 0:
            print(name, {k: statistics.median(v) for k, v in results["plans"][name].items()
                         if k in ("shaped", "open")}, file=sys.stderr, flush=True)  # fmt: skip
    # the shaped link swept again after the windows: one sweep is a few seconds of a noisy host
    shape(rate)
    results["sweep_shaped_after"] = swept(sweep_tries, failures["shaped"]).model_dump()
    shape(None)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()  # a gloo group alive at exit can abort the process


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("rate", help="tc's syntax, e.g. 1gbit")
    parser.add_argument("plans", nargs="+", metavar="NAME=KNOBS")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="window pairs per plan")
    parser.add_argument("--sweep-tries", type=int, default=1, help="sweeps before a refused fit fails")  # fmt: skip
    args = parser.parse_args()
    main(args.out, args.rate, args.plans, args.rounds, args.sweep_tries)
