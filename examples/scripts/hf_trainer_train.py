"""An ordinary HF Trainer script: the tiny Llama of tiny_model.py on synthetic tokens.

    python examples/scripts/hf_trainer_train.py --output_dir /tmp/hf-out --max_steps 10
    torchrun --nproc-per-node 2 examples/scripts/hf_trainer_train.py --output_dir /tmp/hf-out \
        --deepspeed ds_config.json --per_device_train_batch_size 2 --max_steps 10

Every TrainingArguments flag works (HfArgumentParser). ``--fail-at-step N`` raises at that
optimizer step (to show a crashing trial). Prints the logged losses as its last line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from tiny_model import Tokens, build_model, leave_group
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


@dataclass
class ScriptArguments:
    fail_at_step: int = 0
    """Raise at this optimizer step (0: never)."""


class Losses(TrainerCallback):
    """Collects the logged losses; raises at ``fail_at`` if asked."""

    def __init__(self, fail_at: int) -> None:
        self.values: list[float] = []
        self.fail_at = fail_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.values.append(float(logs["loss"]))

    def on_step_begin(self, args, state, control, **kwargs):
        if self.fail_at and state.global_step + 1 == self.fail_at:
            raise RuntimeError(f"planned failure at step {self.fail_at}")


def main() -> None:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    script, args = parser.parse_args_into_dataclasses()
    losses = Losses(script.fail_at_step)
    trainer = Trainer(model=build_model(), args=args, train_dataset=Tokens(), callbacks=[losses])
    trainer.train()
    if trainer.is_world_process_zero():
        print(json.dumps({"losses": losses.values, "deepspeed": trainer.is_deepspeed_enabled,
                          "finite": all(torch.isfinite(torch.tensor(losses.values)))}))  # fmt: skip
    leave_group()


if __name__ == "__main__":
    main()
