"""Offload's host side: host RAM per node of ZeRO-Offload and ZeRO-3 parameter offload lies between
the bare states and DeepSpeed's own buffered estimators; the device side of ZeRO-2 offload equals
DeepSpeed's; a plan fits only where both sides fit."""

from __future__ import annotations

from dataclasses import replace

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
    text = f"precision=bf16,stage=2,nproc_per_node={per_node},nnodes={nodes}" + (
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
    text = (
        f"precision=bf16,stage=3,nproc_per_node={per_node},nnodes={nodes},offload_optimizer=cpu"
        + (",offload_param=cpu" if params else "")
    )
    host = host_bytes_per_node(_facts(psi, largest), parse_plan(text))
    bare = (12 + (2 if params else 0)) * psi / nodes
    assert bare <= host <= ds_host


def test_a_plan_fits_only_where_the_host_side_fits_too() -> None:
    psi, largest = MODELS["13B"]
    facts = _facts(psi, largest)
    plan = parse_plan("precision=bf16,stage=3,nproc_per_node=8,offload_optimizer=cpu")
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
    assert (
        host_bytes_per_node(facts, parse_plan("stage=3,nproc_per_node=8,offload_optimizer=cpu"))
        == 0
    )


def _timed_facts(host_adam_per_s: float | None) -> ModelFacts:
    """The 13B facts with a measured baseline (fp32, micro-batch 1, 8 ranks' worth of step)."""
    from autotune.estimator._modelfacts import Baseline
    from autotune.records import AtPeak

    psi, largest = MODELS["13B"]
    base = Baseline(plan=parse_plan("mb=1"), peak=0, at_peak=AtPeak(), dataloader=0.0,
                    forward=0.3, backward=0.6, optimizer=0.08,
                    host_adam_per_s=host_adam_per_s)  # fmt: skip
    facts = _facts(psi, largest)
    spec = facts.activations["bf16"].model_copy(update={"source": "measured"})
    return facts.model_copy(update={"baseline": base, "activations": {"fp32": spec}})


def test_an_offloaded_step_costs_the_host_adam_step_and_the_transfer() -> None:
    """Offloading the optimizer of a ZeRO-3 plan on 8 ranks of one node swaps the device's step
    over the rank's shard (0.08 s / 8) for the host's: 8 ranks each stepping psi / 8 fp32
    elements on one CPU at its probed rate, plus the host link's traffic."""
    psi = MODELS["13B"][0]
    rate, pcie = 2e9, 200.0
    machine = Machine(nproc_per_node=8, pcie_gbps=pcie)
    on_device = estimate_plan(_timed_facts(rate), parse_plan("stage=3,mb=1,nproc_per_node=8"),
                              machine=machine)  # fmt: skip
    offloaded = estimate_plan(_timed_facts(rate),
                              parse_plan("stage=3,mb=1,nproc_per_node=8,offload_optimizer=cpu"),
                              machine=machine)  # fmt: skip
    assert on_device.predicted_step_seconds and offloaded.predicted_step_seconds
    # fp32 gradients down and fp32 weights back, psi / 8 each per rank, over 200 Gbit/s
    transfer = 2 * 4 * psi / 8 * 8 / (pcie * 1e9)
    expected = psi / 8 * 8 / rate - 0.08 / 8 + transfer
    gained = offloaded.predicted_step_seconds - on_device.predicted_step_seconds
    assert gained == pytest.approx(expected, rel=1e-9)
    assert any("optimizer steps on the host's CPU" in note for note in offloaded.notes)
    assert any(f"at 200 Gbit/s (--pcie-gbps): {transfer:.3f} s" in note for note in offloaded.notes)
    read = estimate_plan(_timed_facts(rate), offloaded.plan,
                         machine=replace(machine, pcie_source="nvml"))  # fmt: skip
    assert any("(read by NVML on the profiled GPU)" in note for note in read.notes)


def test_without_a_probed_host_rate_an_offloaded_step_time_is_not_guessed() -> None:
    plan = parse_plan("stage=3,mb=1,nproc_per_node=8,offload_optimizer=cpu")
    estimate = estimate_plan(_timed_facts(None), plan, machine=Machine(nproc_per_node=8))
    assert estimate.predicted_step_seconds is None and estimate.predicted_step_time_ratio is None
    assert any("host's Adam rate" in note for note in estimate.notes)
