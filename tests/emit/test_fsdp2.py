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
    "engine=fsdp2,stage=3,precision=bf16,nproc_per_node=4",
    "engine=fsdp2,stage=2,precision=fp32,nproc_per_node=2,ga=4",
    "engine=fsdp2,stage=3,precision=amp_bf16,offload_param=cpu,nproc_per_node=8,nnodes=2,ckpt=4",
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
    config = accelerate_fsdp_config(plan, layer_class="LlamaDecoderLayer", num_blocks=4)
    path.write_text(yaml.safe_dump(config))
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP"
    assert loaded.num_processes == plan.world_size and loaded.num_machines == plan.nnodes
    plugin: object = _plugin_from_launch(path)
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is (plan.zero_stage == 3)
    offload = plugin.cpu_offload
    assert isinstance(offload, CPUOffloadPolicy) == (plan.offload_param == "cpu")
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.activation_checkpointing == (plan.checkpoint_blocks == 4)  # all L=4 blocks


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


TWO_RANK = Path(__file__).with_name("_fsdp2_two_rank.py")
RUN_PLANS = {  # K of the 4 blocks of tests/_models.py's residual MLP
    "engine=fsdp2,stage=3,ckpt=2,nproc_per_node=2": 2,
    "engine=fsdp2,stage=2,precision=bf16,ckpt=4,nproc_per_node=2": 4,
    "engine=fsdp2,stage=3,offload_param=cpu,ckpt=1,nproc_per_node=2": 1,
    "engine=fsdp2,stage=3,nproc_per_node=2": 0,
}


@pytest.mark.slow
def test_the_emitted_code_runs_in_two_ranks_and_checkpoints_k_blocks(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from autotune.emit import block_stack_expression

    codes = [
        {"name": text, "code": fsdp2_deliverable(
            parse_plan(text), block_stack=block_stack_expression("blocks"), num_blocks=4).code}
        for text in RUN_PLANS
    ]  # fmt: skip
    (tmp_path / "codes.json").write_text(json.dumps(codes))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               f"--log-dir={tmp_path / 'torchrun'}", str(TWO_RANK), str(tmp_path / "codes.json"), str(tmp_path / "out.json")]  # fmt: skip
    done = subprocess.run(command, env=dict(env, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    for text, k in RUN_PLANS.items():
        # a checkpointed block runs its forward again in backward: twice, the others once
        assert results[text]["calls"] == [2] * k + [1] * (4 - k), text
        assert all(results[text]["sharded"]), text
        assert results[text]["loss"] > 0, text


def test_the_block_path_is_the_models_or_said_to_be_a_default() -> None:
    from autotune.emit import block_stack_expression

    plan = parse_plan("engine=fsdp2,stage=3,ckpt=2")
    default = fsdp2_deliverable(plan)
    assert "blocks = model.model.layers  # a default, not read from your model" in default.code
    assert any("is a default" in note for note in default.notes)
    assert not default.block_stack_from_model
    given = fsdp2_deliverable(plan, block_stack=block_stack_expression("encoder.0.layers"))
    assert "blocks = model.get_submodule('encoder.0.layers')" in given.code
    assert not any("is a default" in note for note in given.notes)
    lines = given.code.splitlines()
    first_shard = next(i for i, line in enumerate(lines) if "fully_shard(" in line)
    checkpoint = next(i for i, line in enumerate(lines) if "partial(checkpoint" in line)
    assert checkpoint < first_shard and "blocks[:2]" in lines[checkpoint - 1]


@pytest.mark.parametrize(("k", "blocks", "switch"), [(0, 4, False), (2, 4, False), (4, 4, True),
                                                     (2, None, False)])  # fmt: skip
def test_accelerate_and_the_trainer_checkpoint_every_block_only_when_k_is_l(
    k: int, blocks: int | None, switch: bool, tmp_path: Path
) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    from autotune.emit import accelerate_fsdp_yaml

    out = fsdp2_deliverable(parse_plan(f"engine=fsdp2,stage=3,ckpt={k}"), num_blocks=blocks)
    path = tmp_path / "accelerate.yaml"
    path.write_text(accelerate_fsdp_yaml(out.accelerate_config))
    assert not path.read_text().lstrip().startswith("{")  # YAML, not JSON
    assert load_config_from_file(str(path)).fsdp_config["fsdp_activation_checkpointing"] is switch
    assert _plugin_from_launch(path).activation_checkpointing is switch
    assert out.hf_trainer["fsdp_config"]["activation_checkpointing"] is switch
    partial = k > 0 and not switch
    assert (f"blocks[:{k}]" in out.accelerate_code) is partial
    assert any("switch checkpoints every block" in note for note in out.notes) is partial


def test_more_checkpointed_blocks_than_the_model_has_are_refused() -> None:
    with pytest.raises(AutotuneError, match="checkpoints 6 blocks, the model has 4"):
        fsdp2_deliverable(parse_plan("engine=fsdp2,stage=3,ckpt=6"), num_blocks=4)


def test_config_prints_the_code_and_writes_yaml_taking_the_stack_from_the_profile(
    tmp_path: Path,
) -> None:
    from _profiles import synthetic_profile
    from typer.testing import CliRunner

    from autotune.cli import app

    profile = tmp_path / "profile.json"
    profile.write_text(synthetic_profile(layers=12).model_dump_json())  # model.layers, 12 blocks
    out = tmp_path / "accelerate_fsdp2.yaml"
    args = ["config", "--plan", "engine=fsdp2,stage=3,ckpt=12", "--profile", str(profile)]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "blocks = model.model.layers\n" in result.stdout  # read from the model, no "default"
    assert "for block in blocks[:12]:" in result.stdout and '"code":' not in result.stdout
    written = yaml.safe_load(out.read_text())
    assert not out.read_text().lstrip().startswith("{")
    assert written["fsdp_config"]["fsdp_activation_checkpointing"] is True  # K = L = 12
    assert written["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    printed = CliRunner().invoke(app, ["config", "--plan", "engine=fsdp2,stage=3,ckpt=2"])
    assert printed.exit_code == 0, printed.output
    shown = printed.stdout.split("(YAML)")[1].split("\n\n#")[0].split("\n", 1)[1]
    assert yaml.safe_load(shown)["fsdp_config"]["fsdp_activation_checkpointing"] is False  # 2 < L
    assert "a default, not read from your model" in printed.stdout


@pytest.mark.parametrize(("k", "switch"), [(12, True), (4, False)])
def test_tunes_fsdp2_yaml_wraps_the_models_block_class_and_checkpoints_only_when_k_is_l(
    k: int, switch: bool, tmp_path: Path
) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    from autotune.cli.tune import _write_outputs
    from autotune.records import BlockStack, Recommendation
    from autotune.search import TuneRecord

    plan = parse_plan(f"engine=fsdp2,stage=3,ckpt={k},nproc_per_node=2")
    record = TuneRecord(
        model_file="m.py", study="s", storage="sqlite:///s.db", global_batch=8, nproc_per_node=2,
        device_memory=None, objective="tokens_per_s", trials=[],
        recommendation=Recommendation(source="tune", plan=plan),
        block_stack=BlockStack(path="model.layers", count=12, block_class="LlamaDecoderLayer"),
    )  # fmt: skip
    _write_outputs(record, tmp_path, 2)
    config = load_config_from_file(str(tmp_path / "accelerate_fsdp2.yaml")).fsdp_config
    assert config["fsdp_activation_checkpointing"] is switch  # Accelerate's switch is all L
    assert config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
