"""An ordinary Accelerate script: the tiny Llama of tiny_model.py on synthetic tokens.

    torchrun --nproc-per-node 2 examples/scripts/accelerate_train.py --batch-size 2 --steps 10
    accelerate launch --num_processes 2 examples/scripts/accelerate_train.py \
        --deepspeed-config ds_config.json --batch-size 2 --grad-accum 1

``--batch-size`` is the loader's batch; ``--deepspeed-config`` trains through DeepSpeed
(DeepSpeedPlugin). ``--fail-at-step N`` raises at that optimizer step. Prints the losses last.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from tiny_model import LR, Tokens, build_model, leave_group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--deepspeed-config", default=None)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps")
    parser.add_argument("--fail-at-step", type=int, default=0)
    args = parser.parse_args()
    plugin = DeepSpeedPlugin(hf_ds_config=args.deepspeed_config) if args.deepspeed_config else None
    accelerator = Accelerator(mixed_precision=args.mixed_precision,
                              gradient_accumulation_steps=args.grad_accum,
                              deepspeed_plugin=plugin)  # fmt: skip
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=args.batch_size, shuffle=True)
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
                losses.append(float(loss.detach().float()))
                if len(losses) == args.fail_at_step:
                    raise RuntimeError(f"planned failure at step {args.fail_at_step}")
            if len(losses) == args.steps:
                break
    # Rank 0 by the launcher's variable: on a CPU under DeepSpeed, Accelerate (1.x) counts one
    # process per rank (num_processes 1), so every rank would say it is the main one.
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"losses": losses, "finite": all(torch.isfinite(torch.tensor(losses)))}))
    leave_group()


if __name__ == "__main__":
    main()
