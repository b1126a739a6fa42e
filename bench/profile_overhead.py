"""Profiler overhead: median timed step inside ``profile()`` / median step of a plain loop.

Same model file, batch and device. Two interleavings in one process, so machine noise
hits both sides alike: (1) step by step, the profiler's timed step
(``TrainRunner.step()``, exactly what ``profile()`` times) alternating with a plain
textbook step, ``--pairs`` times, with a bootstrap interval; (2) whole ``profile()``
runs alternating with plain loops, ``--repeats`` times. Goal: ratio <= 1.03.

    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_overhead.py [examples/tiny_llama.py] \
        [--batch-size 4] [--steps 10] [--warmup 2] [--repeats 3] [--pairs 40]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autotune.runtime._step import TrainRunner
from autotune.runtime.modelfile import load_model_file
from autotune.runtime.profiler import profile


class PlainStep:
    """The textbook loop over the model file's own hooks, one step per call."""

    def __init__(self, path: Path, batch_size: int) -> None:
        self.module = load_model_file(path).module
        torch.manual_seed(0)
        self.model = self.module.build_model()
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batch_size = batch_size

    def __call__(self) -> float:
        start = time.perf_counter()
        batch: Any = self.module.build_batch(self.batch_size)
        if hasattr(self.module, "loss_fn"):
            loss = self.module.loss_fn(self.model, batch)
        else:
            assert isinstance(batch, Mapping)
            loss = self.model(**batch).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start


def step_interleaved(path: Path, batch_size: int, pairs: int, warmup: int) -> None:
    """Alternate the profiler's timed step with a plain step; ratio of medians, 95% bootstrap."""
    runner = TrainRunner(load_model_file(path), device="cpu", micro_batch=batch_size)
    plain = PlainStep(path, batch_size)
    for _ in range(warmup):
        runner.step()
        plain()
    ours, theirs = [], []
    for index in range(pairs):
        if index % 2:  # alternate which goes first
            ours.append(runner.step().total)
            theirs.append(plain())
        else:
            theirs.append(plain())
            ours.append(runner.step().total)
    ratio = statistics.median(ours) / statistics.median(theirs)
    rng = random.Random(0)
    boots = sorted(
        statistics.median(rng.choices(ours, k=pairs))
        / statistics.median(rng.choices(theirs, k=pairs))
        for _ in range(2000)
    )
    print(
        f"(1) step-interleaved, {pairs} pairs: profiler step {statistics.median(ours) * 1e3:.1f} ms, "
        f"plain {statistics.median(theirs) * 1e3:.1f} ms, ratio {ratio:.3f} "
        f"(95% bootstrap {boots[50]:.3f}-{boots[1949]:.3f}); goal <= 1.03",
        flush=True,
    )


def plain_loop(path: Path, batch_size: int, steps: int, warmup: int) -> float:
    """Median step time of ``steps`` plain steps after ``warmup``."""
    plain = PlainStep(path, batch_size)
    times = [plain() for _ in range(warmup + steps)]
    return statistics.median(times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="examples/tiny_llama.py", type=Path)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=40)
    args = parser.parse_args()
    step_interleaved(args.model, args.batch_size, args.pairs, args.warmup)
    ratios, inside, plain = [], [], []
    for repeat in range(args.repeats):
        record = profile(
            args.model,
            batch_size=args.batch_size,
            steps=args.steps,
            warmup=args.warmup,
            device="cpu",
        )
        inside.append(record.time.step)
        plain.append(plain_loop(args.model, args.batch_size, args.steps, args.warmup))
        ratios.append(inside[-1] / plain[-1])
        print(
            f"repeat {repeat}: profile {inside[-1] * 1e3:.1f} ms, plain {plain[-1] * 1e3:.1f} ms, "
            f"ratio {ratios[-1]:.3f}",
            flush=True,
        )
    ratio = statistics.median(inside) / statistics.median(plain)
    print(
        f"(2) whole runs, model {args.model}, batch {args.batch_size}, "
        f"{args.steps} steps x {args.repeats} repeats"
    )
    print(
        f"median step: profile {statistics.median(inside) * 1e3:.1f} ms, "
        f"plain loop {statistics.median(plain) * 1e3:.1f} ms"
    )
    print(
        f"overhead ratio (median/median): {ratio:.3f}; per-repeat ratios "
        f"min {min(ratios):.3f} median {statistics.median(ratios):.3f} max {max(ratios):.3f}; "
        f"goal <= 1.03"
    )


if __name__ == "__main__":
    main()
