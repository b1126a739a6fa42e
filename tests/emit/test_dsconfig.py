"""The DeepSpeed config emitter: plan keys, merging into a base, hf_auto, and the checks."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from typing import Any

import pytest

from autotune.api import deepspeed_config
from autotune.emit import KNOWN_TOP_LEVEL_KEYS, check_config, plan_readback
from autotune.estimator import BUCKET_SIZE, bucket_elements
from autotune.records import AutotuneError, Capabilities, Plan, Recommendation, parse_plan
from autotune.runtime.ds_validate import validate_with_deepspeed

CPU = Capabilities(
    bf16_supported=True, fp16_supported=False, sdpa_available=True, flash_attn_available=False
)


def get(config: dict[str, Any], path: str) -> Any:
    for name in path.split("."):
        config = config[name]
    return config


@pytest.mark.parametrize(
    ("knobs", "world", "expected"),
    [
        (
            "stage=0",
            1,
            {"train_batch_size": 1, "zero_optimization.stage": 0, "bf16.enabled": False},
        ),
        (
            "mb=4,ga=8",
            16,
            {
                "train_batch_size": 512,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 8,
            },
        ),
        (
            "stage=2,precision=bf16",
            2,
            {
                "bf16.enabled": True,
                "fp16.enabled": False,
                "zero_optimization.overlap_comm": True,
                "zero_optimization.contiguous_gradients": True,
            },
        ),
        (
            "stage=1,precision=fp16",
            2,
            {
                "fp16.enabled": True,
                "fp16.loss_scale": 0,
                "fp16.initial_scale_power": 16,
                "fp16.hysteresis": 2,
                "fp16.loss_scale_window": 1000,
                "fp16.min_loss_scale": 1,
            },
        ),
        (
            "precision=amp_bf16",
            1,
            {
                "torch_autocast.enabled": True,
                "torch_autocast.dtype": "bfloat16",
                "bf16.enabled": False,
            },
        ),
        (
            "stage=2,offload_optimizer=cpu",
            4,
            {
                "zero_optimization.offload_optimizer.device": "cpu",
                "zero_optimization.offload_optimizer.pin_memory": True,
                "zero_force_ds_cpu_optimizer": False,
            },
        ),
        (
            "stage=3,offload_param=cpu,offload_optimizer=cpu",
            2,
            {"zero_optimization.offload_param.device": "cpu", "zero_optimization.stage": 3},
        ),
    ],
)
def test_plan_keys(knobs: str, world: int, expected: dict[str, Any]) -> None:
    config = deepspeed_config(parse_plan(knobs), world_size=world)
    for path, value in expected.items():
        assert get(config, path) == value, path
    assert config["zero_allow_untested_optimizer"] is True  # torch client optimizer


def test_world_size_defaults_to_the_plans_devices() -> None:
    plan = parse_plan("mb=2,ga=3,nproc_per_node=4,nnodes=2")
    assert deepspeed_config(plan)["train_batch_size"] == 2 * 3 * 8
    assert deepspeed_config(plan, world_size=2)["train_batch_size"] == 2 * 3 * 2


def test_recommendation_gives_its_plans_config() -> None:
    rec = Recommendation(source="plan", plan=parse_plan("stage=3,mb=2"))
    assert deepspeed_config(rec, world_size=2) == deepspeed_config(rec.plan, world_size=2)


@pytest.mark.parametrize(
    ("parameters", "elements"),
    [
        (None, BUCKET_SIZE),  # unknown: DeepSpeed's default
        (0, 2),
        (1, 2),
        (2145, 2146),  # rounded up to ZeRO's 2-element alignment
        (2146, 2146),
        (BUCKET_SIZE - 1, BUCKET_SIZE),
        (BUCKET_SIZE + 1, BUCKET_SIZE),
        (7_000_000_000, BUCKET_SIZE),
    ],
)
def test_bucket_elements_is_the_model_size_capped_at_the_default(
    parameters: int | None, elements: int
) -> None:
    assert bucket_elements(parameters) == elements


def test_bucket_elements_rejects_a_negative_count() -> None:
    with pytest.raises(AutotuneError, match="parameters: -1"):
        bucket_elements(-1)


@pytest.mark.parametrize(
    ("knobs", "parameters", "reduce", "allgather"),
    [
        ("stage=2", None, BUCKET_SIZE, BUCKET_SIZE),
        ("stage=2", 2145, 2146, 2146),
        ("stage=1,precision=bf16", 10_000_000, 10_000_000, 10_000_000),
        ("stage=3", 2145, 2146, None),
        ("stage=3", None, BUCKET_SIZE, None),
    ],
)
def test_bucket_keys_follow_the_model_size(
    knobs: str, parameters: int | None, reduce: int, allgather: int | None
) -> None:
    zero = deepspeed_config(parse_plan(knobs), world_size=2, parameters=parameters)[
        "zero_optimization"
    ]
    assert zero["reduce_bucket_size"] == reduce
    assert zero.get("allgather_bucket_size") == allgather


def test_stage0_has_no_buckets_whatever_the_model_size() -> None:
    zero = deepspeed_config(parse_plan("stage=0"), world_size=2, parameters=2145)
    assert zero["zero_optimization"] == {"stage": 0}


def test_recommendation_sizes_buckets_with_its_parameter_count() -> None:
    rec = Recommendation(source="tune", plan=parse_plan("stage=2,mb=2"), parameters=2145)
    zero = deepspeed_config(rec, world_size=2)["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 2146
    # an explicit count wins over the recommendation's
    explicit = deepspeed_config(rec, world_size=2, parameters=10_000)["zero_optimization"]
    assert explicit["reduce_bucket_size"] == 10_000


def test_base_keys_are_kept_and_auto_filled() -> None:
    base = {
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "steps_per_print": 50,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 12345},
        "train_micro_batch_size_per_gpu": "auto",
    }
    config = deepspeed_config(parse_plan("stage=2,mb=4"), world_size=2, base=base)
    assert config["optimizer"] == base["optimizer"]
    assert config["steps_per_print"] == 50
    assert config["zero_optimization"]["reduce_bucket_size"] == 12345  # their tuning value kept
    assert config["train_micro_batch_size_per_gpu"] == 4  # "auto" filled from the plan
    assert "zero_allow_untested_optimizer" not in config  # they configured DeepSpeed's optimizer
    assert base["train_micro_batch_size_per_gpu"] == "auto"  # the caller's dict is not mutated


@pytest.mark.parametrize(
    ("base", "key", "theirs", "ours"),
    [
        ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage", "3", "2"),
        ({"train_micro_batch_size_per_gpu": 8}, "train_micro_batch_size_per_gpu", "8", "4"),
        ({"bf16": {"enabled": True}}, "bf16.enabled", "True", "False"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
            "zero_optimization.offload_optimizer.device",
            "'cpu'",
            "'none'",
        ),
        ({"train_batch_size": 100}, "train_batch_size", "100", "8"),
    ],
)
def test_base_conflicts_name_the_key_and_both_values(
    base: dict[str, Any], key: str, theirs: str, ours: str
) -> None:
    with pytest.raises(AutotuneError) as info:
        deepspeed_config(parse_plan("stage=2,mb=4"), world_size=2, base=base)
    message = str(info.value)
    assert key in message and theirs in message and ours in message


def test_unknown_top_level_key_in_base_is_refused_with_a_hint() -> None:
    with pytest.raises(AutotuneError, match="'optimzer'.*did you mean 'optimizer'"):
        deepspeed_config(Plan(), base={"optimzer": {"type": "Adam"}})


def test_known_top_level_keys_are_deepspeeds_own() -> None:
    deepspeed = pytest.importorskip("deepspeed")
    from pathlib import Path

    source = "".join(
        p.read_text(errors="ignore") for p in Path(deepspeed.__file__).parent.rglob("*.py")
    )
    missing = [
        key for key in KNOWN_TOP_LEVEL_KEYS if f'"{key}"' not in source and f"'{key}'" not in source
    ]
    assert missing == []


def test_hf_auto_writes_auto_where_the_trainer_fills() -> None:
    base = {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    config = deepspeed_config(parse_plan("stage=3,mb=2,precision=bf16"), base=base, hf_auto=True)
    for path in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "bf16.enabled",
        "zero_optimization.reduce_bucket_size",
    ):
        assert get(config, path) == "auto", path
    assert config["optimizer"]["params"]["lr"] == "auto"  # theirs, left for the Trainer
    assert config["zero_optimization"]["stage"] == 3  # the plan's, never "auto"


def test_auto_the_plan_does_not_decide_needs_hf_auto() -> None:
    base = {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    with pytest.raises(AutotuneError, match=r'optimizer\.params\.lr is "auto"'):
        deepspeed_config(Plan(), base=base)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            {"zero_optimization": {"stage": 1, "offload_param": {"device": "cpu"}}},
            "offload_param needs stage 3",
        ),
        (
            {"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
            "needs stage 1, 2 or 3",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            "nvme needs nvme_path",
        ),
        ({"zero_optimization": {"stage": 5}}, "must be 0, 1, 2 or 3"),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "choose one"),
        ({"train_batch_size": 3}, r"not micro-batch x accumulation x world size \(1 x 1 x 2 = 2\)"),
    ],
)
def test_own_checks_refuse_what_deepspeed_accepts_silently(
    config: dict[str, Any], match: str
) -> None:
    full = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
    }
    with pytest.raises(AutotuneError, match=match):
        check_config(full | config, world_size=2)


def test_nvme_offload_needs_a_path() -> None:
    plan = parse_plan("stage=3,offload_param=nvme,offload_optimizer=nvme")
    with pytest.raises(AutotuneError, match="nvme_path"):
        deepspeed_config(plan)
    config = deepspeed_config(plan, nvme_path="/local_nvme")
    assert config["zero_optimization"]["offload_param"]["nvme_path"] == "/local_nvme"


@pytest.mark.parametrize("precision", ["fp16", "amp_fp16"])
def test_fp16_refused_on_a_device_without_it(precision: str) -> None:
    plan = parse_plan(f"stage=1,precision={precision}")
    with pytest.raises(AutotuneError, match="does not support fp16"):
        deepspeed_config(plan, capabilities=CPU)
    rec = Recommendation(source="tune", plan=plan, capabilities=CPU)
    with pytest.raises(AutotuneError, match="does not support fp16"):
        deepspeed_config(rec)
    assert deepspeed_config(plan)["zero_optimization"]["stage"] == 1  # unknown device: allowed


def _every_plan() -> list[Plan]:
    plans = []
    for stage, precision, opt, param in itertools.product(
        range(4), ["fp32", "bf16", "fp16", "amp_bf16"], ["none", "cpu"], ["none", "cpu"]
    ):
        if (param != "none" and stage != 3) or (opt != "none" and stage == 0):
            continue
        plans.append(
            Plan(
                zero_stage=stage,
                precision=precision,
                offload_optimizer=opt,
                offload_param=param,
                micro_batch=2,
                grad_accum=3,
                nproc_per_node=4,
            )
        )
    return plans


def test_every_emitted_config_is_accepted_by_deepspeed_and_implements_its_plan() -> None:
    pytest.importorskip("deepspeed")
    for plan in _every_plan():
        config = deepspeed_config(plan)  # validated by DeepSpeedConfig for world size 4 inside
        readback = plan_readback(config)
        assert readback["zero_optimization.stage"] == plan.zero_stage
        assert readback["zero_optimization.offload_param.device"] == plan.offload_param
        assert readback["train_batch_size"] == 24
        assert validate_with_deepspeed(config, world_size=4) is not None


def test_deepspeed_checks_for_the_target_world_size() -> None:
    pytest.importorskip("deepspeed")
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
    }
    assert validate_with_deepspeed(config, world_size=8)
    with pytest.raises(
        AutotuneError, match="DeepSpeed .* rejects the config: .*8 != 1 \\* 1 \\* 2"
    ):
        validate_with_deepspeed(config, world_size=2)


def test_deepspeeds_own_rejection_is_one_line() -> None:
    pytest.importorskip("deepspeed")
    config = {
        "train_batch_size": 1,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2, "not_a_zero_key": 1},
    }
    with pytest.raises(AutotuneError, match="rejects the config") as info:
        validate_with_deepspeed(config, world_size=1)
    assert "\n" not in str(info.value) and "not_a_zero_key" in str(info.value)


_CHILD = """
import json, sys
{block}
from autotune import deepspeed_config, parse_plan
from autotune.runtime.ds_validate import validate_with_deepspeed
config = deepspeed_config(parse_plan("stage=2,mb=2,nproc_per_node=2"))
print(json.dumps({{"config": config, "validated": validate_with_deepspeed(config, world_size=2)}}))
"""


@pytest.mark.parametrize("blocked", [False, True])
def test_stdout_stays_clean_and_works_without_deepspeed(blocked: bool) -> None:
    block = "sys.modules['deepspeed'] = None" if blocked else ""
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}  # no DS_ACCELERATOR: DeepSpeed warns
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(block=block)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout)  # nothing but the JSON on stdout
    assert result["config"]["train_batch_size"] == 4
    assert (result["validated"] is None) == blocked
