"""Offload's host side: host RAM per node of ZeRO-Offload and ZeRO-3 parameter offload lies between
the bare states and DeepSpeed's own buffered estimators; the device side of ZeRO-2 offload equals
DeepSpeed's; a plan fits only where both sides fit."""

from __future__ import annotations

import pytest

from autotune.estimator import ActivationSpec, ModelFacts, estimate_plan, host_bytes_per_node
from autotune.estimator._zero import states_for
from autotune.records import Machine, parse_plan

# Llama-2-7B and a 13B Llama: parameters and the largest layer (the embedding, vocab x hidden)
MODELS = {"7B": (6_738_415_616, 32_000 * 4_096), "13B": (13_015_864_320, 32_000 * 5_120)}
DEVICES = (1, 8, 64)  # 8 per node


def _facts(psi: int, largest: int) -> ModelFacts:
    return ModelFacts(name="llama", parameters=psi, trainable_parameters=psi,
                      largest_layer_parameters=largest, parameter_sizes=(largest, psi - largest),
                      activations={"bf16": ActivationSpec(fixed=0.0, per_sample=2**30,
                                                          source="formula")},
                      device_type="cuda")  # fmt: skip


def _layout(n: int) -> tuple[int, int]:
    per_node = min(n, 8)
    return per_node, n // per_node


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("offload", [False, True], ids=["on-device", "offloaded"])
def test_zero2_states_lie_between_the_bare_states_and_deepspeeds_estimator(
    model: str, n: int, offload: bool
) -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    psi, largest = MODELS[model]
    per_node, nodes = _layout(n)
    ds_host, ds_device = estimate_zero2_model_states_mem_needs(
        psi, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=offload,
        additional_buffer_factor=1.5,
    )  # fmt: skip
    text = f"precision=bf16,stage=2,gpus={per_node},nodes={nodes}" + (
        ",offload_optimizer=cpu" if offload else ""
    )
    facts = _facts(psi, largest)
    plan = parse_plan(text)
    device = states_for(facts, plan).total
    host = host_bytes_per_node(facts, plan)
    # bare: 16-bit weights, and (on the device or the host) the fp32 master and Adam's moments
    bare_device = 2 * psi + (0 if offload else (2 + 12) * psi / n)
    bare_host = 12 * psi / nodes if offload else 0
    assert bare_device <= device <= ds_device
    if offload:
        assert device == ds_device == 2 * psi  # only the 16-bit weights stay on the device
        assert bare_host <= host <= ds_host
    else:
        assert host == 0  # DeepSpeed's figure is what loading the fp32 model takes


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("n", DEVICES)
@pytest.mark.parametrize("params", [False, True], ids=["optimizer", "optimizer+params"])
def test_zero3_offload_host_ram_lies_between_the_bare_states_and_deepspeeds_estimator(
    model: str, n: int, params: bool
) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    psi, largest = MODELS[model]
    per_node, nodes = _layout(n)
    ds_host, _, _ = estimate_zero3_model_states_mem_needs(
        psi, largest, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=True,
        cpu_offload_params=params, zero_init=True, additional_buffer_factor=1.5,
    )  # fmt: skip
    text = f"precision=bf16,stage=3,gpus={per_node},nodes={nodes},offload_optimizer=cpu" + (
        ",offload_param=cpu" if params else ""
    )
    host = host_bytes_per_node(_facts(psi, largest), parse_plan(text))
    bare = (12 + (2 if params else 0)) * psi / nodes
    assert bare <= host <= ds_host


def test_a_plan_fits_only_where_the_host_side_fits_too() -> None:
    psi, largest = MODELS["13B"]
    facts = _facts(psi, largest)
    plan = parse_plan("precision=bf16,stage=3,gpus=8,offload_optimizer=cpu")
    host = host_bytes_per_node(facts, plan)
    # master 4 + moments 8 + fp32 gradients 4 + the reduced bf16 gradients 2, per parameter
    assert host == pytest.approx(8 * 18 * psi / 8)
    big, small = (Machine(device_memory=80 * 2**30, host_memory=int(m * host)) for m in (2, 0.5))
    assert estimate_plan(facts, plan, machine=big).fits is not False
    tight = estimate_plan(facts, plan, machine=small)
    assert tight.host_fits is False and tight.fits is False
    assert tight.host_bytes_per_node == round(host)


def test_nothing_is_offloaded_where_the_host_is_the_device() -> None:
    psi, largest = MODELS["7B"]
    facts = _facts(psi, largest).model_copy(update={"device_type": "cpu"})
    assert host_bytes_per_node(facts, parse_plan("stage=3,gpus=8,offload_optimizer=cpu")) == 0
