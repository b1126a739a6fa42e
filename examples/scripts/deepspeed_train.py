"""An ordinary DeepSpeed script: the tiny Llama of tiny_model.py on synthetic tokens.

    deepspeed --num_gpus 2 examples/scripts/deepspeed_train.py \
        --deepspeed_config examples/scripts/ds_config.json --batch-size 2 --steps 10
    torchrun --nproc-per-node 2 examples/scripts/deepspeed_train.py \
        --deepspeed_config ds_config.json --batch-size 2

``--batch-size`` is the loader's batch (the config's train_micro_batch_size_per_gpu must agree);
``--fail-at-step N`` raises at that optimizer step. Prints the losses as its last line.
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch
from tiny_model import LR, Tokens, build_model, leave_group, single_process_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps")
    parser.add_argument("--fail-at-step", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    single_process_env()
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    engine, *_ = deepspeed.initialize(args=args, model=model, optimizer=optimizer)
    data = Tokens()
    sampler = torch.utils.data.DistributedSampler(data, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    losses: list[float] = []
    while len(losses) < args.steps:
        for batch in loader:
            batch = {key: value.to(engine.device) for key, value in batch.items()}
            loss = engine(**batch).loss
            engine.backward(loss)
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if boundary:
                losses.append(float(loss.detach().float()))
                if len(losses) == args.fail_at_step:
                    raise RuntimeError(f"planned failure at step {args.fail_at_step}")
            if len(losses) == args.steps:
                break
    if engine.global_rank == 0:
        print(json.dumps({"losses": losses, "finite": all(torch.isfinite(torch.tensor(losses)))}))
    leave_group()


if __name__ == "__main__":
    main()
