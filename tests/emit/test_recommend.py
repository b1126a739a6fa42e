"""The recommendation record, the code changes beside the config, and recommend()."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest

import autotune
import autotune.api
import autotune.emit._changes
import autotune.estimator
import autotune.policy
from autotune.api import deepspeed_config
from autotune.emit import code_changes_for, hf_training_arguments
from autotune.records import AutotuneError, CodeChange, Plan, Recommendation, parse_plan


@pytest.mark.parametrize("module", [autotune.emit._changes, autotune.api._configs])
def test_docstring_examples_run(module: Any) -> None:
    result = doctest.testmod(module, extraglobs={"Plan": Plan}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_public_names_are_exported() -> None:
    assert autotune.deepspeed_config is autotune.api.deepspeed_config
    # the stage packages are not top-level names, so importing them shadows no public function
    assert autotune.recommend is autotune.api.recommend
    assert autotune.suggest is autotune.policy.suggest
    assert autotune.estimate is autotune.estimator.estimate
    assert autotune.Recommendation is Recommendation
    assert {"deepspeed_config", "recommend", "Recommendation"} <= set(autotune.__all__)


def test_recommendation_round_trips_through_json() -> None:
    rec = Recommendation(source="tune", plan=parse_plan("stage=2,ckpt=3"),
                         code_changes=code_changes_for(parse_plan("stage=2,ckpt=3")))  # fmt: skip
    again = Recommendation.model_validate_json(rec.model_dump_json())
    assert again == rec
    assert again.capabilities is None  # not measured, not a default device


@pytest.mark.parametrize(
    ("knobs", "whats"),
    [
        ("stage=2", ["run with the DeepSpeed config"]),
        ("ckpt=2", ["run with", "activation checkpointing of the first 2 blocks"]),
        ("ckpt=4", ["run with", "activation checkpointing of all blocks"]),
        ("workers=4,pin_memory=true", ["run with", "data loading with 4 workers"]),
        ("attn=sdpa,compile=true", ["run with", "attention implementation sdpa", "torch.compile"]),
    ],
)
def test_code_changes_cover_what_the_config_cannot(knobs: str, whats: list[str]) -> None:
    changes = code_changes_for(parse_plan(knobs), block_stack_path="model.layers", num_blocks=4)
    assert len(changes) == len(whats)
    for change, what in zip(changes, whats, strict=True):
        assert change.what.startswith(what)
        assert change.deepspeed and change.hf_trainer and change.accelerate


def test_full_checkpointing_uses_the_frameworks_switches() -> None:
    full = code_changes_for(parse_plan("ckpt=4"), block_stack_path="model.layers", num_blocks=4)[1]
    part = code_changes_for(parse_plan("ckpt=3"), block_stack_path="model.layers", num_blocks=4)[1]
    assert "_checkpointing=True" in str(full.hf_trainer)
    assert "_checkpointing_enable(" in str(full.accelerate)
    assert "_checkpointing=False" in str(part.hf_trainer)  # the switch would take all 4
    assert 'get_submodule("model.layers")' in str(part.torch) and "[:3]" in str(part.torch)
    unknown = code_changes_for(parse_plan("ckpt=3"))[1]
    assert "your nn.ModuleList" in str(unknown.torch)


def _stack_model() -> Any:
    import torch

    torch.manual_seed(0)
    inner = torch.nn.Module()
    inner.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
    model = torch.nn.Module()
    model.model = inner
    return model


def _run(model: Any, x: Any) -> Any:
    for layer in model.model.layers:
        x = layer(x).tanh()
    return x


def test_printed_torch_checkpointing_lines_run_and_keep_gradients() -> None:
    import torch
    from torch.utils.checkpoint import checkpoint

    change: CodeChange = code_changes_for(parse_plan("ckpt=3"), block_stack_path="model.layers",
                                          num_blocks=4)[1]  # fmt: skip
    plain, wrapped = _stack_model(), _stack_model()
    exec(str(change.torch), {"model": wrapped})
    wrapped_forwards = [getattr(block.forward, "func", None) for block in wrapped.model.layers]
    assert wrapped_forwards == [checkpoint] * 3 + [None]
    x = torch.randn(2, 8)
    _run(plain, x).sum().backward()
    _run(wrapped, x).sum().backward()
    for a, b in zip(plain.parameters(), wrapped.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad)


@pytest.mark.parametrize("knobs", ["mb=4,ga=8,precision=bf16", "ckpt=4,workers=2,pin_memory=true"])
def test_hf_training_arguments_are_real_trainer_arguments(knobs: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    plan = parse_plan(knobs)
    args = hf_training_arguments(plan, num_blocks=4)
    training = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **args)
    assert training.per_device_train_batch_size == plan.micro_batch
    assert training.gradient_accumulation_steps == plan.grad_accum
    switch = (
        "activation_checkpointing"
        if hasattr(training, "activation_checkpointing")
        else "gradient_checkpointing"
    )
    assert getattr(training, switch) == (plan.checkpoint_blocks == 4)


# The Trainer's bf16/fp16 per plan precision, from what they mean: with a DeepSpeed config they
# are its bf16/fp16 sections (16-bit weights); without one, torch.autocast over fp32 weights.
# fmt: off
TRAINER_FLAGS = [  # (precision, with the config: (bf16, fp16), without it: (bf16, fp16))
    ("fp32",     (False, False), (False, False)),
    ("amp_bf16", (False, False), (True, False)),
    ("amp_fp16", (False, False), (False, True)),
    ("bf16",     (True, False),  None),  # 16-bit weights: DeepSpeed's alone
    ("fp16",     (False, True),  None),
]
# fmt: on


@pytest.mark.parametrize(("precision", "with_config", "plain"), TRAINER_FLAGS)
def test_the_trainers_precision_switches_follow_the_plan(
    precision: str, with_config: tuple[bool, bool], plain: tuple[bool, bool] | None
) -> None:
    plan = parse_plan(f"mb=2,precision={precision}")
    args = hf_training_arguments(plan)
    assert (args["bf16"], args["fp16"]) == with_config
    if plain is None:
        with pytest.raises(AutotuneError, match="needs a DeepSpeed engine"):
            hf_training_arguments(plan, deepspeed=False)
    else:
        args = hf_training_arguments(plan, deepspeed=False)
        assert (args["bf16"], args["fp16"]) == plain


@pytest.mark.parametrize("precision", [row[0] for row in TRAINER_FLAGS])
@pytest.mark.parametrize("hf_auto", [False, True])
def test_the_trainer_accepts_the_plans_config_and_keeps_its_precision(
    precision: str, hf_auto: bool, tmp_path: Path
) -> None:
    """The Trainer's own check (``HfTrainerDeepSpeedConfig``): no mismatch between the config
    and the arguments, and the config it ends with still runs the plan's precision."""
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    plan = parse_plan(f"stage=2,mb=2,ga=2,precision={precision}")
    training = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, **hf_training_arguments(plan)
    )
    trainer_config = HfTrainerDeepSpeedConfig(deepspeed_config(plan, hf_auto=hf_auto))
    trainer_config.trainer_config_process(training)
    assert trainer_config.mismatches == []
    final = trainer_config.config
    assert final["bf16"]["enabled"] is (precision == "bf16")
    assert final["fp16"]["enabled"] is (precision == "fp16")
    autocast = {"amp_bf16": "bfloat16", "amp_fp16": "float16"}.get(precision)
    assert (final.get("torch_autocast") or {}).get("dtype") == autocast


def test_recommend_rejects_a_batch_that_does_not_split() -> None:
    with pytest.raises(AutotuneError, match="multiple of nproc_per_node x nnodes = 4"):
        autotune.recommend("model.py", global_batch=6, nproc_per_node=4)


@pytest.mark.slow
def test_recommend_without_search_profiles_and_asks_the_policy(examples_dir: Path) -> None:
    rec = autotune.recommend(examples_dir / "mlp_dataloader.py", global_batch=8, device="cpu")
    assert rec.source == "suggest" and rec.plan.global_batch == 8
    assert rec.capabilities is not None and rec.code_changes[0].what.startswith("run with")
    config = deepspeed_config(rec)
    assert config["train_batch_size"] == 8
    json.dumps(config)


@pytest.mark.slow
def test_recommend_with_search_returns_the_tuned_recommendation(
    examples_dir: Path, tmp_path: Path
) -> None:
    from autotune.search import TrialResult
    from autotune.search._runner import FakeRunner

    def behaviour(plan: Plan, settings: Any) -> TrialResult:
        speed = 10.0 + plan.micro_batch  # made up: bigger micro-batches are faster
        return TrialResult(completed_steps=3, samples_per_s=speed, peak_memory_bytes=[1000],
                           peak_source="fake", device_memory=settings.device_memory)  # fmt: skip

    runner = FakeRunner(behaviour)
    rec = autotune.recommend(examples_dir / "mlp_dataloader.py", global_batch=8, device="cpu",
                             search=True, runner=runner, trials=3,
                             storage=str(tmp_path / "study.db"))  # fmt: skip
    assert rec.source == "tune" and runner.plans  # the trials went through the given runner
    assert rec.plan in runner.plans and rec.plan.global_batch == 8
    assert deepspeed_config(rec)["train_batch_size"] == 8


def test_hooks_become_a_model_file_that_imports_them(
    examples_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.api import hooks_model_file
    from autotune.runtime.modelfile import load_model_file

    monkeypatch.syspath_prepend(str(examples_dir))
    import mlp_dataloader

    shim = tmp_path / "hooks.py"
    shim.write_text(hooks_model_file({"build_model": mlp_dataloader.build_model,
                                      "build_dataloader": mlp_dataloader.build_dataloader}))  # fmt: skip
    loaded = load_model_file(shim)
    assert type(loaded.build_model()) is type(mlp_dataloader.build_model())
    with pytest.raises(AutotuneError, match="module-level function"):
        hooks_model_file({"build_model": lambda: None})
    with pytest.raises(AutotuneError, match="unknown hook 'model'"):
        hooks_model_file({"model": mlp_dataloader.build_model})


@pytest.mark.slow
def test_recommend_takes_callables(examples_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(examples_dir))
    import mlp_dataloader

    hooks = {
        "build_model": mlp_dataloader.build_model,
        "build_dataloader": mlp_dataloader.build_dataloader,
        "loss_fn": mlp_dataloader.loss_fn,
    }
    rec = autotune.recommend(hooks, global_batch=4, device="cpu")
    assert rec.plan.global_batch == 4
    assert rec.model_file is not None and rec.model_file.startswith("callables: ")
    assert rec.model_file.endswith("mlp_dataloader.build_dataloader, mlp_dataloader.loss_fn")


ZOO = Path(__file__).resolve().parents[2] / "examples" / "zoo"


@pytest.mark.parametrize("name", ["bert", "llama_gqa", "t5", "vit"])
def test_attention_lines_mask_as_the_model_does(name: str) -> None:
    # The reference: the attention modules transformers builds for the zoo's config say
    # themselves whether they are causal; the snippet loads the profiled class, not a causal LM.
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.from_pretrained(ZOO / f"{name}.json")
    model = getattr(transformers, config.architectures[0])(config)
    causal = {
        m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)
    }
    class_name = type(model).__name__
    change = code_changes_for(parse_plan("attn=sdpa"), model_class=class_name)[-1]
    lines = str(change.torch)
    assert ("is_causal=True" in lines) == (True in causal)
    assert ("attn_mask=padding_mask" in lines) == (False in causal)
    assert f"{class_name}.from_pretrained(" in str(change.hf_trainer)
    assert "AutoModelForCausalLM" not in str(change.deepspeed) + str(change.accelerate)
