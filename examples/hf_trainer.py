"""The HF Trainer with an autotune DeepSpeed config: the tiny Llama of tiny_llama.py, synthetic data.

Run on one CPU process:  python examples/hf_trainer.py --plan "stage=2,mb=2,ga=2" --steps 3
or on several ranks:     torchrun --nproc_per_node=2 examples/hf_trainer.py --plan "stage=2,nproc_per_node=2"
The last stdout line is JSON: {"plan", "losses", "world_size", "deepspeed", "resolved"}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from deepspeed_train import checkpoint_blocks, leave_group, single_process_env
from tiny_llama import SEQ_LEN, VOCAB, build_model
from transformers import Trainer, TrainerCallback, TrainingArguments

from autotune import deepspeed_config, parse_plan
from autotune.emit import code_changes_for, hf_training_arguments


class Synthetic(torch.utils.data.Dataset):
    """Fixed random token sequences; labels are the inputs (causal LM)."""

    def __init__(self, size: int = 64) -> None:
        self.ids = torch.randint(
            0, VOCAB, (size, SEQ_LEN), generator=torch.Generator().manual_seed(0)
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class Losses(TrainerCallback):
    """Collects the logged training losses."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.values.append(float(logs["loss"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", default="stage=2,mb=2,ga=2")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    single_process_env()
    world = int(os.environ["WORLD_SIZE"])
    plan = parse_plan(args.plan)
    # "auto" lets TrainingArguments fill batch sizes, clipping and precision;
    # hf_training_arguments(plan) gives the values that make them the plan's.
    config = deepspeed_config(plan, world_size=world, hf_auto=True)
    torch.manual_seed(0)
    model = build_model()
    if 0 < plan.checkpoint_blocks < 4:  # all 4: TrainingArguments' switch does it
        checkpoint_blocks(model, plan.checkpoint_blocks)
    for change in code_changes_for(plan, block_stack_path="model.layers", num_blocks=4)[1:]:
        print(f"# code change: {change.what}")
    losses = Losses()
    # The Trainer needs an output folder; it saves nothing there (save_strategy "no").
    with tempfile.TemporaryDirectory(prefix="autotune-hf-") as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            deepspeed=config,
            max_steps=args.steps,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),  # HF refuses bf16 on CPU without it
            **hf_training_arguments(plan, num_blocks=4),
        )
        trainer = Trainer(
            model=model, args=training_args, train_dataset=Synthetic(), callbacks=[losses]
        )
        trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        # What the Trainer handed DeepSpeed once it filled the "auto" values.
        used = trainer.accelerator.state.deepspeed_plugin.deepspeed_config
        keys = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
        resolved = {key: used[key] for key in keys} | {"stage": used["zero_optimization"]["stage"]}
        print(
            json.dumps(
                {
                    "plan": plan.describe(),
                    "losses": losses.values,
                    "world_size": world,
                    "deepspeed": trainer.is_deepspeed_enabled,
                    "resolved": resolved,
                }
            )
        )
    leave_group()


if __name__ == "__main__":
    main()
