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

from autotune.runtime.trial.steps import leave_ranks

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


def train(
    config: dict[str, Any], steps: int = STEPS
) -> tuple[list[float], float, dict[str, int] | None]:
    """Train ``steps`` optimizer steps; return this rank's losses, a parameter checksum and,
    for a ZeRO-Offload config, the bytes of what it keeps on the host (:func:`offloaded_bytes`)."""
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
    host = offloaded_bytes(engine.optimizer) if "offload_optimizer" in config.get(
        "zero_optimization", {}) else None  # fmt: skip
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(
        params, enabled=config["zero_optimization"]["stage"] == 3
    ):
        checksum = float(sum(p.detach().float().sum() for p in params))
    engine.destroy()
    return losses, checksum, host


def _nbytes(tensors: Any) -> int:
    """Bytes of the distinct storages among ``tensors`` (a 0-dim step counter left out)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def offloaded_bytes(optimizer: Any) -> dict[str, int]:
    """What a ZeRO-Offload engine keeps on the host, by the estimator's parts, read from
    DeepSpeed's own optimizer objects (deepspeed 0.19 ``stage_1_and_2.py`` / ``stage3.py``):
    the fp32 master partition, the optimizer's moments on it, the fp32 gradient partition (and
    ZeRO-1/2's host accumulation buffers), ZeRO-1/2's 16-bit copy-back buffer and pinned
    one-parameter gradient buffer."""
    masters = list(
        getattr(optimizer, "single_partition_of_fp32_groups", None)
        or getattr(optimizer, "fp32_partitioned_groups_flat", [])
    )
    states = [v for m in masters for v in optimizer.optimizer.state.get(m, {}).values()]
    grads = [m.grad for m in masters if m.grad is not None]
    grads += list(getattr(optimizer, "accumulated_grads_in_cpu", {}).values())
    grads.append(getattr(optimizer, "grad_partitions_flat_buffer", None))  # stage 3's reduced
    return {
        "master": _nbytes(masters),
        "optimizer_states": _nbytes(states),
        "gradients": _nbytes(grads),
        "parameters": _nbytes(
            getattr(optimizer, "param_buffer_of_bit16_for_cpu_offload_groups", [])
        ),
        "buffers": _nbytes([getattr(optimizer, "temp_grad_buffer_for_cpu_offload", None)]),
    }


def main(configs_path: str, out_path: str) -> None:
    """Train every config in the file; rank 0 writes the results."""
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for entry in json.loads(Path(configs_path).read_text(encoding="utf-8")):
        losses, checksum, host = train(entry["config"])
        checksums: list[float | None] = [None] * dist.get_world_size()
        dist.all_gather_object(checksums, checksum)
        results[entry["name"]] = {"losses": losses, "checksums": checksums, "host": host}
    if dist.get_rank() == 0:
        with open(out_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    # CI saw a rank abort at exit in test_two_ranks_in_one_torchrun (leave_ranks says why).
    leave_ranks()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
