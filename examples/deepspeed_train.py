"""deepspeed.initialize with an autotune config: the tiny Llama of tiny_llama.py, a few steps.

One CPU process:  python examples/deepspeed_train.py --plan "stage=3,precision=bf16,mb=2" --steps 3
Several ranks:    torchrun --nproc_per_node=2 examples/deepspeed_train.py --plan "stage=2,nproc_per_node=2"
A saved config:   python examples/deepspeed_train.py --config ds_config.json
The last stdout line is JSON: {"plan", "losses", "world_size"}.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import socket
import sys

import deepspeed
import torch
from tiny_llama import build_batch, build_model
from torch.utils.checkpoint import checkpoint

from autotune import deepspeed_config, parse_plan


def single_process_env() -> None:
    """The launcher's variables for a plain ``python`` run (else DeepSpeed looks for MPI)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def leave_group() -> None:
    """Leave the process group together before exiting: a gloo group alive at interpreter exit
    can abort the process in its destructor ("terminate called without an active exception",
    SIGABRT) after the training itself has finished."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def checkpoint_blocks(model: torch.nn.Module, blocks: int) -> None:
    """The plan's activation checkpointing, as code_changes_for() prints it."""
    for block in model.get_submodule("model.layers")[:blocks]:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", default="stage=2,mb=2")
    parser.add_argument("--config", help="a DeepSpeed config file written by `autotune config`")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    single_process_env()
    world = int(os.environ["WORLD_SIZE"])
    plan = parse_plan(args.plan)
    if args.config:
        with open(args.config, encoding="utf-8") as handle:
            config = json.load(handle)
    else:
        config = deepspeed_config(plan, world_size=world)
    torch.manual_seed(0)
    model = build_model()
    checkpoint_blocks(model, plan.checkpoint_blocks)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=1e-3
    )  # a torch optimizer: nothing compiles
    with contextlib.redirect_stdout(sys.stderr):  # keep DeepSpeed's prints off the JSON line
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    losses = []
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            batch = build_batch(engine.train_micro_batch_size_per_gpu())
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
        losses.append(float(loss.detach()))
    if engine.global_rank == 0:
        print(json.dumps({"plan": plan.describe(), "losses": losses, "world_size": world}))
    leave_group()


if __name__ == "__main__":
    main()
