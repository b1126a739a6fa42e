"""Trains a tiny model under DeepSpeed with each emitted config; run by torchrun or imported.

``torchrun --standalone --nproc_per_node=2 tests/_ds_two_rank.py CONFIGS.json OUT.json``
trains every config in CONFIGS.json (a list of ``{"name", "config"}``) for a few
steps and has rank 0 write ``{name: {"losses", "checksums"}}`` to OUT.json, where
``checksums`` holds every rank's sum of the full (gathered) parameters.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

STEPS = 4
FEATURES = 16


def tiny_model(seed: int = 0) -> nn.Module:
    """Two blocks of Linear layers: enough for ZeRO-3 to partition, quick on one core."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def batch(micro: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same regression batch at every step for a (micro-batch, rank): the loss must fall.

    Ranks see different data, as in data parallelism.
    """
    generator = torch.Generator().manual_seed(1000 * rank + micro)
    x = torch.randn(size, FEATURES, generator=generator)
    return x, x[:, :1] * 2 - x[:, 1:2]


def train(config: dict[str, Any], steps: int = STEPS) -> tuple[list[float], float]:
    """Train ``steps`` optimizer steps; return this rank's losses and a parameter checksum."""
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with contextlib.redirect_stdout(sys.stderr):
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
    rank = dist.get_rank() if dist.is_initialized() else 0
    losses = []
    for _ in range(steps):
        for micro in range(engine.gradient_accumulation_steps()):
            x, y = batch(micro, rank, engine.train_micro_batch_size_per_gpu())
            loss = nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
            engine.backward(loss)
            engine.step()
        losses.append(float(loss.detach()))
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(
        params, enabled=config["zero_optimization"]["stage"] == 3
    ):
        checksum = float(sum(p.detach().float().sum() for p in params))
    engine.destroy()
    return losses, checksum


def main(configs_path: str, out_path: str) -> None:
    """Train every config in the file; rank 0 writes the results."""
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for entry in json.loads(Path(configs_path).read_text(encoding="utf-8")):
        losses, checksum = train(entry["config"])
        checksums: list[float | None] = [None] * dist.get_world_size()
        dist.all_gather_object(checksums, checksum)
        results[entry["name"]] = {"losses": losses, "checksums": checksums}
    if dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    dist.barrier()
    dist.destroy_process_group()  # a gloo group alive at exit can abort the process (SIGABRT)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
