"""Accelerate with an autotune DeepSpeed config (DeepSpeedPlugin(hf_ds_config=...)), tiny Llama.

One CPU process:  python examples/accelerate_train.py --plan "stage=2,mb=2,ga=2" --steps 3
Several ranks:    torchrun --nproc_per_node=2 examples/accelerate_train.py --plan "stage=2,nproc_per_node=2"
The last stdout line is JSON: {"plan", "losses", "world_size", "deepspeed", "resolved"}.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from deepspeed_train import checkpoint_blocks, leave_group, single_process_env
from tiny_llama import build_batch, build_model

from autotune import deepspeed_config, parse_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", default="stage=2,mb=2,ga=2")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    single_process_env()
    world = int(os.environ["WORLD_SIZE"])
    plan = parse_plan(args.plan)
    config = deepspeed_config(plan, world_size=world)
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no")
    accelerator = Accelerator(
        mixed_precision=mixed,
        gradient_accumulation_steps=plan.grad_accum,
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
    )
    torch.manual_seed(0)
    model = build_model()
    checkpoint_blocks(model, plan.checkpoint_blocks)  # what the config cannot carry
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [build_batch(plan.micro_batch) for _ in range(4)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)  # already batched
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses: list[float] = []
    while len(losses) < args.steps:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                losses.append(float(loss.detach()))
            if len(losses) == args.steps:
                break
    if accelerator.is_main_process:
        used = accelerator.state.deepspeed_plugin.deepspeed_config
        keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
        resolved = {key: used[key] for key in keys} | {"stage": used["zero_optimization"]["stage"]}
        print(
            json.dumps(
                {
                    "plan": plan.describe(),
                    "losses": losses,
                    "world_size": world,
                    "deepspeed": accelerator.distributed_type.value == "DEEPSPEED",
                    "resolved": resolved,
                }
            )
        )
    leave_group()


if __name__ == "__main__":
    main()
