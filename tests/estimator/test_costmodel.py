"""The cost model's formulas against hand-computed values (ZeRO paper, METHOD.md)."""

from __future__ import annotations

import pytest

from autotune.estimator import offload_bytes_per_step, train_days
from autotune.estimator._costmodel import (
    ActivationFigures,
    BaselineTime,
    activation_peak,
    flops_per_token,
    saved_activations,
    step_seconds,
    tokens_per_second_at_mfu,
    transfer_seconds,
)
from autotune.estimator._zero import (
    model_state_bytes,
    paper_floor,
    zero3_bytes,
    zero_bucket_bytes,
)

GB = 1e9


@pytest.mark.parametrize(
    ("stage", "expected_gb"),
    [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)],
)
def test_paper_floor_reproduces_the_zero_paper_example(stage: int, expected_gb: float) -> None:
    # ZeRO paper, Figure 1: psi = 7.5B, N = 64, K = 12
    floor = paper_floor(7.5e9, stage, 64)
    assert floor.total / GB == pytest.approx(expected_gb, abs=0.05)
    assert floor.accounting == "paper"


def test_method_section_6_figures() -> None:
    # 16 psi for psi = 6.74B is ~108 GB; ZeRO-2 on 4 devices ~37 GB (model states only)
    assert paper_floor(6.74e9, 0, 1).total / GB == pytest.approx(107.84)
    assert paper_floor(6.74e9, 2, 4).total / GB == pytest.approx(37.07, abs=0.01)


@pytest.mark.parametrize(
    ("stage", "n", "bytes_per_param"),
    [
        (1, 8, 2 + 2 + 16 / 8),  # optimizer states + fp32 gradient partition sharded
        (2, 8, 2 + 18 / 8),  # DeepSpeed PR #5099 estimator
        (2, 64, 2 + 18 / 64),
    ],
)
def test_deepspeed_accounting_for_16bit_weights(stage: int, n: int, bytes_per_param: float) -> None:
    psi = 1e9
    states = model_state_bytes(
        parameters=psi, trainable=psi, precision="bf16", zero_stage=stage, world_size=n
    )
    assert states.total == pytest.approx(bytes_per_param * psi)
    assert states.accounting == "deepspeed"


def test_stage3_at_its_step_holds_deepspeeds_estimate_plus_its_16bit_gradient_partition() -> None:
    # DeepSpeed's estimate_zero3_model_states_mem_needs: 18/N per parameter (fp32 master,
    # moments, fp32 gradients, 16-bit partition) plus 4 x the largest layer gathered. The
    # engine also keeps a 16-bit gradient partition buffer (2/N, stage3.py:791) its
    # estimator leaves out; at the optimizer step nothing is gathered.
    psi, n = 1e9, 16
    moments, _ = zero3_bytes(parameters=psi, trainable=psi, precision="bf16", world_size=n)
    step = moments["optimizer"]
    held = step["parameters"] + step["gradients"] + step["optimizer_states"]
    assert held == pytest.approx(18 / n * psi + 2 / n * psi)


def test_stage3_gathers_every_parameter_from_forward_to_backward() -> None:
    # stage3_max_reuse_distance at its default releases nothing before its backward
    # (partitioned_param_coordinator.py:652): the whole model's 16-bit weights are live.
    psi, n = 1e9, 8
    moments, parts = zero3_bytes(parameters=psi, trainable=psi, precision="bf16", world_size=n)
    gathered = moments["backward"]["parameters"] - moments["optimizer"]["parameters"]
    assert gathered == pytest.approx(2 * psi)
    # The reported parts are each category's largest over the same moments.
    assert parts.parameters == pytest.approx(2 * psi / n + 2 * psi)
    assert parts.gradients == pytest.approx((2 + 4) * psi / n)
    assert parts.optimizer_states == pytest.approx((4 + 8) * psi / n)
    assert model_state_bytes(parameters=psi, trainable=psi, precision="bf16", zero_stage=3,
                             world_size=n) == parts  # fmt: skip


@pytest.mark.parametrize("precision", ["fp32", "amp_bf16", "amp_fp16"])
def test_plain_torch_adam_holds_16_bytes_per_parameter(precision: str) -> None:
    states = model_state_bytes(parameters=1e6, trainable=1e6, precision=precision)
    assert (states.parameters, states.gradients, states.optimizer_states) == (4e6, 4e6, 8e6)
    assert states.accounting == "torch"


def test_frozen_parameters_carry_no_gradients_or_optimizer_state() -> None:
    states = model_state_bytes(parameters=1e6, trainable=2.5e5, precision="fp32")
    assert states.parameters == 4e6
    assert states.gradients == 1e6
    assert states.optimizer_states == 2e6


def test_measured_optimizer_state_replaces_adam_assumption() -> None:
    sgd = model_state_bytes(
        parameters=1e6, trainable=1e6, precision="fp32", optimizer_bytes_per_param=4.0
    )
    assert sgd.optimizer_states == 4e6


@pytest.mark.parametrize(
    ("stage", "offload_param", "expected"),
    [
        (2, False, 2e9),  # DeepSpeed's zero2 estimator with cpu_offload: 16-bit weights only
        # zero3: DeepSpeed's estimator counts 4 x the largest layer gathered; the engine, with
        # stage3_max_reuse_distance at its default, keeps every parameter gathered up to
        # stage3_max_live_parameters (1e9, here the whole model) from forward to backward.
        (3, False, 2e9 / 4 + 2e9),  # optimizer offloaded: partition + gathered weights
        (3, True, 2e9),  # both offloaded: the gathered weights
    ],
)
def test_offload_matches_deepspeed_estimators(
    stage: int, offload_param: bool, expected: float
) -> None:
    states = model_state_bytes(
        parameters=1e9,
        trainable=1e9,
        precision="bf16",
        zero_stage=stage,
        world_size=4,
        largest_layer=5e7,
        offload_optimizer=True,
        offload_param=offload_param,
    )
    assert states.optimizer_states == 0
    assert states.total == pytest.approx(expected)


FIG = ActivationFigures(
    fixed=1000.0,
    per_sample=10_000.0,
    blocks=4,
    block_fixed=0.0,
    block_per_sample=2000.0,
    block_input_fixed=10.0,
    block_input_per_sample=100.0,
)


@pytest.mark.parametrize(
    ("micro_batch", "k", "expected"),
    [
        (1, 0, 11_000.0),
        (3, 0, 31_000.0),
        # each checkpointed block keeps 10 + 100 b instead of 2000 b
        (3, 1, 31_000.0 - (6000.0 - 310.0)),
        (3, 4, 31_000.0 - 4 * (6000.0 - 310.0)),
    ],
)
def test_saved_activations_with_k_of_l_blocks_checkpointed(
    micro_batch: int, k: int, expected: float
) -> None:
    assert saved_activations(FIG, micro_batch, k) == pytest.approx(expected)


def test_activation_peak_adds_one_recomputed_block_only_when_checkpointing() -> None:
    assert activation_peak(FIG, 2, 0) == saved_activations(FIG, 2, 0)
    assert activation_peak(FIG, 2, 4) == pytest.approx(saved_activations(FIG, 2, 4) + 4000.0)


def test_transfer_seconds_uses_gigabits() -> None:
    assert transfer_seconds(12.5e9, 100.0) == pytest.approx(1.0)
    assert transfer_seconds(1.0, None) is None
    assert transfer_seconds(0.0, None) == 0.0


def test_offload_traffic_counts_gradients_down_and_weights_up() -> None:
    traffic = offload_bytes_per_step(
        parameters=1e9,
        trainable=1e9,
        precision="bf16",
        world_size=4,
        grad_accum=2,
        offload_optimizer=True,
        offload_param=False,
    )
    assert traffic == pytest.approx((2 * 2 + 2) * 1e9 / 4)


BASE = BaselineTime(
    dataloader=0.1,
    forward=1.0,
    backward=2.0,
    optimizer=0.5,
    micro_batch=4,
    blocks=4,
    block_share=0.8,
)


def test_step_seconds_of_the_baseline_is_its_own_step() -> None:
    assert step_seconds(BASE, micro_batch=4) == pytest.approx(BASE.step) == pytest.approx(3.6)


def test_recompute_costs_the_forward_of_the_checkpointed_blocks() -> None:
    # 2 of 4 blocks, the stack is 80 % of the forward: + 2 * 0.2 s
    assert step_seconds(BASE, micro_batch=4, checkpoint_blocks=2) == pytest.approx(4.0)


def test_baseline_recompute_is_taken_out_before_scaling() -> None:
    checkpointed = BaselineTime(**{**BASE.__dict__, "backward": 2.8, "checkpoint_blocks": 4})
    assert step_seconds(checkpointed, micro_batch=4, checkpoint_blocks=0) == pytest.approx(3.6)


def test_accumulation_and_optimizer_sharding() -> None:
    seconds = step_seconds(
        BASE, micro_batch=2, grad_accum=2, optimizer_scale=0.25, extra_seconds=1.0
    )
    assert seconds == pytest.approx(2 * 1.55 + 0.125 + 1.0)


def test_train_days_from_mfu() -> None:
    per_token = flops_per_token(1e9)
    assert per_token == 6e9
    rate = tokens_per_second_at_mfu(0.5, 1e15, 8, per_token)
    assert train_days(rate * 86_400 * 3, rate) == pytest.approx(3.0)
    assert flops_per_token(1e9, layers=2, hidden=10, seq_len=100) == 6e9 + 12 * 2 * 10 * 100


@pytest.mark.parametrize(
    ("stage", "precision", "bytes_per_element"),
    [
        (0, "bf16", 0),  # no ZeRO optimizer, no buckets
        (1, "fp32", 2 * 4),  # two buckets (overlap_comm) in the weights' dtype
        (2, "bf16", 2 * 2),
        (2, "amp_bf16", 2 * 2 * 4),  # fp32 and bf16 communication buckets, both fp32 at 1-2
        (3, "bf16", 2),  # one bucket per communication dtype, in that dtype
        (3, "amp_fp16", 4 + 2),
    ],
)
def test_zero_bucket_bytes(stage: int, precision: str, bytes_per_element: int) -> None:
    got = zero_bucket_bytes(zero_stage=stage, bucket_elements=1000, precision=precision)
    assert got == 1000 * bytes_per_element


def test_one_bucket_without_overlap_comm() -> None:
    got = zero_bucket_bytes(
        zero_stage=2, bucket_elements=1000, precision="fp16", overlap_comm=False
    )
    assert got == 1000 * 2


def test_deepspeed_fp32_gradient_partition_exists_only_in_the_step() -> None:
    kw = {"parameters": 1e6, "trainable": 1e6, "precision": "bf16", "world_size": 4}
    two = model_state_bytes(zero_stage=2, **kw)  # type: ignore[arg-type]
    assert two.step_gradients == 4 * 1e6 / 4
    assert two.gradients - two.step_gradients == 2 * 1e6 / 4
    three = model_state_bytes(zero_stage=3, **kw)  # type: ignore[arg-type]
    assert three.step_gradients == 4 * 1e6 / 4  # stage 3's too: made at the step
