"""The FSDP2 deliverable read back by accelerate's and transformers' own parsers, and the plan knob."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
import yaml

from autotune.emit import (
    accelerate_fsdp_config,
    accelerate_plugin_code,
    fsdp2_code,
    fsdp2_deliverable,
    hf_fsdp2_arguments,
)
from autotune.records import AutotuneError, parse_plan

PLANS = [
    "engine=fsdp2,stage=3,precision=bf16,gpus=4",
    "engine=fsdp2,stage=2,precision=fp32,gpus=2,ga=4",
    "engine=fsdp2,stage=3,precision=amp_bf16,offload_param=cpu,gpus=8,nodes=2,ckpt=4",
]


def _plugin_from_launch(config_file: Path) -> object:
    """What ``accelerate launch --config_file`` hands the training script's FSDP plugin."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    with mock.patch.dict(os.environ, env):
        return FullyShardedDataParallelPlugin()


@pytest.mark.parametrize("text", PLANS)
def test_accelerate_reads_the_config_file(text: str, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from torch.distributed.fsdp import CPUOffloadPolicy

    plan = parse_plan(text)
    path = tmp_path / "fsdp2.yaml"
    path.write_text(yaml.safe_dump(accelerate_fsdp_config(plan, layer_class="LlamaDecoderLayer")))
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP"
    assert loaded.num_processes == plan.world_size and loaded.num_machines == plan.nodes
    plugin: object = _plugin_from_launch(path)
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is (plan.zero_stage == 3)
    offload = plugin.cpu_offload
    assert isinstance(offload, CPUOffloadPolicy) == (plan.offload_param == "cpu")
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing == (plan.checkpoint_blocks > 0)


def test_the_plugin_code_fixes_reduce_dtype_fp32() -> None:
    import torch

    plan = parse_plan(PLANS[0])
    code = accelerate_plugin_code(plan).replace("accelerator = Accelerator(fsdp_plugin=plugin)", "")
    scope: dict[str, object] = {}
    exec(code, scope)  # noqa: S102 - the emitted lines, run as a user would
    policy = scope["plugin"].mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert scope["plugin"].reshard_after_forward is True


@pytest.mark.parametrize("text", PLANS)
def test_training_arguments_take_the_hf_arguments(text: str, tmp_path: Path) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    plan = parse_plan(text)
    kwargs = hf_fsdp2_arguments(plan, "LlamaDecoderLayer")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)
    plugin_args = args.fsdp_plugin_args
    assert plugin_args["fsdp_version"] == 2
    assert plugin_args["reshard_after_forward"] is (plan.zero_stage == 3)
    assert plugin_args.get("cpu_offload", False) == (plan.offload_param == "cpu")
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    assert plugin.fsdp_version == 2
    assert args.per_device_train_batch_size == plan.micro_batch


def test_the_code_runs_fully_shard_per_block_then_root() -> None:
    code = fsdp2_code(parse_plan(PLANS[0]), "model.layers")
    calls = [line.strip() for line in code.splitlines() if "fully_shard(" in line]
    assert calls == [
        "fully_shard(block, reshard_after_forward=True, mp_policy=mp)",
        "fully_shard(model, mp_policy=mp)",
    ]
    assert "reduce_dtype=torch.float32" in code
    offload = fsdp2_code(parse_plan(PLANS[2]))
    assert "offload_policy=offload" in offload and "torch.autocast" in offload


def test_a_deepspeed_plan_has_no_fsdp2_deliverable() -> None:
    with pytest.raises(AutotuneError, match="not engine=fsdp2"):
        fsdp2_deliverable(parse_plan("stage=3"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine=fsdp2,stage=1", "zero_stage 2"),
        ("engine=fsdp2,stage=0", "zero_stage 2"),
        ("engine=fsdp2,stage=3,precision=fp16", "fp16"),
        ("engine=fsdp2,stage=3,offload_optimizer=cpu", "offload_param=cpu"),
        ("engine=fsdp2,stage=3,offload_param=nvme", "nvme"),
        ("engine=megatron,stage=3", "engine"),
    ],
)
def test_plans_fsdp2_cannot_express_are_refused(text: str, message: str) -> None:
    with pytest.raises(AutotuneError, match=message):
        parse_plan(text)


def test_the_engine_round_trips_through_describe() -> None:
    plan = parse_plan("engine=fsdp2,stage=2,mb=4")
    assert "engine=fsdp2" in plan.describe()
    assert parse_plan(plan.describe()) == plan
    assert not plan.uses_deepspeed and plan.reshard_after_forward is False
    assert "engine" not in parse_plan("stage=3").describe()
