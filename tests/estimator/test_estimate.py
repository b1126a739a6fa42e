"""The estimator: a profile's own plan comes back as measured; other plans move as the model says."""

from __future__ import annotations

import pytest
from _profiles import HAND_L as L
from _profiles import HAND_P as P
from _profiles import hand_profile as make_profile

from autotune.estimator import (
    ActivationSpec,
    Claim,
    EstimateRecord,
    ModelFacts,
    estimate,
    estimate_plan,
    facts_from_profile,
    fit_step_time,
    plan_grid,
)
from autotune.estimator._estimator import cpu_core_share
from autotune.records import AtPeak, Machine, Plan, ProfileRecord, TimedSteps


@pytest.mark.parametrize(
    "at_peak",
    [
        None,  # peak at the start of backward
        AtPeak(
            parameters=4 * P, gradients=4 * P, optimizer_states=8 * P, temporaries=300_000
        ),  # optimizer step
    ],
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_estimate_on_the_profiled_plan_equals_the_profile(
    at_peak: AtPeak | None, checkpointing: bool
) -> None:
    record = make_profile(at_peak=at_peak, checkpointing=checkpointing)
    facts = facts_from_profile(record)
    assert facts.baseline is not None
    result = estimate_plan(facts, facts.baseline.plan)
    assert result.memory.peak == record.memory.peak
    assert result.predicted_step_time_ratio == pytest.approx(1.0)
    assert result.source == "measured"
    assert result.accounting == "torch"


def test_facts_from_profile_reads_the_profiled_plan() -> None:
    facts = facts_from_profile(make_profile(checkpointing=True))
    assert facts.baseline is not None
    assert facts.baseline.plan.checkpoint_blocks == L
    assert facts.baseline.plan.micro_batch == 4
    assert facts.optimizer_bytes_per_param == 8.0
    assert facts.optimizer_source == "measured"
    assert facts.activations["fp32"].per_sample == 998_000.0


def test_doubling_the_micro_batch_adds_the_per_sample_activations_and_temporaries() -> None:
    facts = facts_from_profile(make_profile())
    base = estimate_plan(facts, Plan(micro_batch=4))
    double = estimate_plan(facts, Plan(micro_batch=8))
    act4, act8 = 8_000 + 4 * 998_000, 8_000 + 8 * 998_000
    # the measured activations scale by the model's ratio, the loss's temporaries per sample
    expected = base.memory.peak + 4_000_000 * (act8 / act4 - 1) + 400_000
    assert double.memory.peak == pytest.approx(expected, abs=2)
    assert double.memory.activations == act8


def test_accumulation_keeps_the_earlier_micro_batches_gradients_live_in_backward() -> None:
    facts = facts_from_profile(make_profile())  # peaks at the start of backward, no gradients
    one = estimate_plan(facts, Plan(micro_batch=4))
    two = estimate_plan(facts, Plan(micro_batch=4, grad_accum=2))
    # plain torch creates gradients in the first backward: the last one starts with all of them
    assert two.memory.peak == pytest.approx(one.memory.peak + 4 * P, abs=2)


def test_a_zero2_plan_peaks_at_the_reduction_of_deepspeeds_buckets() -> None:
    from autotune.estimator import bucket_elements

    facts = facts_from_profile(make_profile())  # fp32 torch profile peaking in backward
    # at micro-batch 2 the activations (about 2 MB) are below the flattened copy (4 MB)
    est = estimate_plan(facts, Plan(zero_stage=2, micro_batch=2, nproc_per_node=2)).memory
    bucket = 4 * bucket_elements(P)  # fp32 buckets sized to the model
    assert bucket == 4_000_000
    # By hand from deepspeed 0.19's stage_1_and_2.py at the end of backward: the flat fp32
    # weights 4P; the fp32 master and Adam's two moments on this rank's half (4 + 8) P / 2;
    # the two buckets and the copy the all-reduce flattens (the bucket holds the whole
    # model, so the rank's gradient partition, 4 (P / 2 + 200,000) with its edge parameter,
    # is made after that copy is gone and is smaller); the activations are gone.
    assert bucket > 4 * (P / 2 + 200_000)
    assert est.temporaries == 2 * bucket + bucket
    assert est.peak == pytest.approx(4 * P + 128 + 6 * P + 3 * bucket)
    assert est.peak_composition.startswith("reduce")


@pytest.mark.parametrize(
    ("stage", "backward", "at_step"),
    [
        # stages 1-2: two buckets in backward and the largest layer's gradient (200,000 fp32
        # parameters) before its hook copies it in, gone at the step; Adam's two temporaries of
        # the fp32 partition there. Stage 3: one bucket throughout.
        (1, 8.0e6 + 4 * 200_000, 2 * 4.0 * P / 2),
        (2, 8.0e6 + 4 * 200_000, 2 * 4.0 * P / 2),
        (3, 4.0e6, 4.0e6 + 2 * 4.0 * P / 2),
    ],
)
def test_zero_temporaries_in_backward_and_at_the_optimizer_step(
    stage: int, backward: float, at_step: float
) -> None:
    from autotune.estimator import moments

    facts = facts_from_profile(make_profile())
    live, _, _ = moments(facts, Plan(zero_stage=stage, micro_batch=4, nproc_per_node=2))
    assert live["optimizer"]["temporaries"] == at_step
    assert live["backward"]["temporaries"] == backward


def test_checkpointing_all_blocks_keeps_inputs_and_one_recomputed_block() -> None:
    facts = facts_from_profile(make_profile())
    full = estimate_plan(facts, Plan(micro_batch=4)).memory.activations
    ckpt = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=L)).memory.activations
    assert ckpt == full - L * (800_000 - 40_000) + 800_000


def test_a_peak_at_the_optimizer_step_stays_there_while_activations_are_small() -> None:
    at_peak = AtPeak(parameters=4 * P, gradients=4 * P, optimizer_states=8 * P)
    facts = facts_from_profile(make_profile(at_peak=at_peak))
    small = estimate_plan(facts, Plan(micro_batch=2))
    assert small.memory.peak == 16 * P
    assert small.memory.peak_composition.startswith("optimizer")
    # a large micro-batch moves the peak to the start of backward
    large = estimate_plan(facts, Plan(micro_batch=64))
    assert large.memory.peak_composition.startswith("backward")
    assert large.memory.peak > 16 * P


def test_time_ratio_counts_recompute_and_accumulation() -> None:
    facts = facts_from_profile(make_profile())
    half_accum = estimate_plan(facts, Plan(micro_batch=2, grad_accum=2))
    # same samples per step: data, forward and backward unchanged, one optimizer step
    assert half_accum.predicted_step_time_ratio == pytest.approx(1.0)
    ckpt = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=L))
    assert ckpt.predicted_step_time_ratio is not None
    assert 1.0 < ckpt.predicted_step_time_ratio <= 1.3  # at most one more forward (0.3 s of 1 s)


def test_another_precision_has_no_measured_time_without_a_matmul_rate() -> None:
    facts = facts_from_profile(make_profile())  # no bf16:fp32 matmul speed measured
    result = estimate_plan(facts, Plan(micro_batch=4, precision="bf16"))
    assert result.predicted_step_time_ratio is None
    assert result.source == "formula"
    assert result.accounting == "deepspeed"
    assert any("precision" in note for note in result.notes)


def test_bf16_plan_from_fp32_profile_scales_compute_by_the_measured_matmul_speed() -> None:
    profile = make_profile()
    caps = profile.environment.capabilities.model_copy(update={"bf16_fp32_speed_ratio": 2.0})
    env = profile.environment.model_copy(update={"capabilities": caps})
    facts = facts_from_profile(profile.model_copy(update={"environment": env}))
    # the hand profile's phases: data 0.05, forward 0.3, backward 0.55, optimizer 0.1 s
    same = estimate_plan(facts, Plan(micro_batch=4))
    assert same.predicted_step_seconds == pytest.approx(0.05 + 0.3 + 0.55 + 0.1)
    for precision in ("bf16", "amp_bf16"):
        bf16 = estimate_plan(facts, Plan(micro_batch=4, precision=precision))
        # matmuls twice as fast: forward and backward halve, data and fp32 optimizer step do not
        assert bf16.predicted_step_seconds == pytest.approx(0.05 + (0.3 + 0.55) / 2 + 0.1)
        assert any("bf16:fp32 matmul speed (2.00)" in note for note in bf16.notes)
    fp16 = estimate_plan(facts, Plan(micro_batch=4, precision="fp16"))
    assert fp16.predicted_step_seconds is None  # no fp16 rate measured

    # the step's 1e9 FLOPs at a peak of 1e9 / 0.425 FLOP/s take half its 0.85 s of forward and
    # backward: only that half runs twice as fast
    compute = profile.compute.model_copy(update={"peak_flops_per_s": 1e9 / 0.425})
    half = facts_from_profile(profile.model_copy(update={"environment": env, "compute": compute}))
    bf16 = estimate_plan(half, Plan(micro_batch=4, precision="bf16"))
    assert bf16.predicted_step_seconds == pytest.approx(0.05 + 0.425 + 0.425 / 2 + 0.1)

    # a profile that timed the model's own bf16 forward and backward (0.4x fp32's) uses that
    time = profile.time.model_copy(update={"bf16_over_fp32": 0.4})
    probed = facts_from_profile(
        profile.model_copy(update={"environment": env, "compute": compute, "time": time})
    )
    for precision in ("bf16", "amp_bf16"):
        bf16 = estimate_plan(probed, Plan(micro_batch=4, precision=precision))
        assert bf16.predicted_step_seconds == pytest.approx(0.05 + 0.85 * 0.4 + 0.1)


def test_the_measured_block_share_at_each_precision_prices_the_recompute() -> None:
    # the hand profile's phases at micro-batch 4: data 0.05, forward 0.3, backward 0.55,
    # optimizer 0.1 s; its blocks took half the fp32 forward and 0.8 of the bf16 one, bf16
    # forward and backward at 0.4x fp32's
    profile = make_profile()
    time = profile.time.model_copy(
        update={"bf16_over_fp32": 0.4, "block_forward_share": {"fp32": 0.5, "bf16": 0.8}}
    )
    facts = facts_from_profile(profile.model_copy(update={"time": time}))
    fp32 = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=L))
    assert fp32.predicted_step_seconds == pytest.approx(1.0 + 0.5 * 0.3)
    bf16 = estimate_plan(facts, Plan(micro_batch=4, precision="bf16", checkpoint_blocks=L))
    assert bf16.predicted_step_seconds == pytest.approx(0.05 + 0.85 * 0.4 + 0.8 * 0.3 * 0.4 + 0.1)
    half = estimate_plan(facts, Plan(micro_batch=4, precision="bf16", checkpoint_blocks=L // 2))
    assert half.predicted_step_seconds == pytest.approx(
        0.05 + 0.85 * 0.4 + 0.8 * 0.3 * 0.4 * (L // 2) / L + 0.1
    )


def test_a_plans_step_time_ratio_is_its_seconds_over_the_profiled_plans() -> None:
    # one answer: a bf16 plan's ratio to the fp32 profile's plan is the ratio of their seconds
    profile = make_profile()
    time = profile.time.model_copy(update={"bf16_over_fp32": 0.4})
    facts = facts_from_profile(profile.model_copy(update={"time": time}))
    own = estimate_plan(facts, Plan(micro_batch=4))
    for plan in (Plan(micro_batch=4, precision="bf16"), Plan(micro_batch=8, precision="amp_bf16")):
        other = estimate_plan(facts, plan)
        assert other.predicted_step_seconds is not None and own.predicted_step_seconds
        assert other.predicted_step_time_ratio == pytest.approx(
            other.predicted_step_seconds / own.predicted_step_seconds
        )


def test_fits_against_a_budget_with_the_margin() -> None:
    facts = facts_from_profile(make_profile())
    peak = estimate_plan(facts, Plan(micro_batch=4)).memory.peak
    budget = int(peak / 0.9) + 10
    fits = estimate_plan(
        facts, Plan(micro_batch=4), machine=Machine(device_memory=budget, margin=0.1)
    )
    assert fits.fits is True
    assert fits.headroom_bytes is not None and 0 <= fits.headroom_bytes < 20
    tight = estimate_plan(
        facts, Plan(micro_batch=4), machine=Machine(device_memory=budget - 20, margin=0.1)
    )
    assert tight.fits is False
    assert estimate_plan(facts, Plan(micro_batch=4)).fits is None


def test_communication_per_step_for_zero_stages() -> None:
    facts = facts_from_profile(make_profile())
    plan = Plan(micro_batch=4, zero_stage=3, nproc_per_node=8, grad_accum=2, precision="bf16")
    result = estimate_plan(facts, plan, machine=Machine(intra_gbps=800.0))
    # ZeRO-3 under 500M parameters: one all-gather and one reduce-scatter per micro-batch, each
    # rank sending 7/8 of each (autotune.estimator._comm); bf16, 2 micro-batches
    assert result.communication_bytes_per_step == round(2 * 7 / 8 * P * 2 * 2)
    assert result.communication_seconds == pytest.approx(7 * P * 8 / 800e9)
    assert any("given --intra-gbps" in note for note in result.notes)
    single = estimate_plan(facts, Plan(micro_batch=4))
    assert single.communication_bytes_per_step == 0


def traced_facts() -> ModelFacts:
    spec = ActivationSpec(
        fixed=0, per_sample=1e9, block_per_sample=2e8, block_input_per_sample=1e7, source="traced"
    )
    return ModelFacts(
        name="traced",
        parameters=7_000_000_000,
        trainable_parameters=7_000_000_000,
        embedding_parameters=130_000_000,
        largest_layer_parameters=130_000_000,
        num_layers=4,
        block_parameters=1_700_000_000,
        hidden_size=4096,
        seq_len=4096,
        activations={"bf16": spec},
    )


def test_estimate_record_with_claim_and_train_days() -> None:
    facts = traced_facts()
    plans = [Plan(precision="bf16", zero_stage=stage, nproc_per_node=4) for stage in (0, 2, 3)]
    record = estimate(
        facts,
        plans,
        machine=Machine(device_memory=80 * 10**9),
        train_tokens=300 * 10**9,
        mfu=0.4,
        peak_flops=312e12,
        claims=[Claim(plans[1], memory_bytes=17_200_000_000)],
    )
    assert isinstance(record, EstimateRecord)
    assert [p.memory.peak for p in record.plans] == sorted(
        (p.memory.peak for p in record.plans), reverse=True
    )
    assert all(p.time_source == "formula" for p in record.plans)
    # By hand: 6 x (7e9 - 1.3e8) + 12 x 4 layers x 4096 x 4096 FLOPs per token, at 40 % of
    # 312 TFLOPS on each of 4 devices, for 300e9 tokens (no block recomputed).
    per_token = 6 * (7_000_000_000 - 130_000_000) + 12 * 4 * 4096 * 4096
    days = 300e9 * per_token / (0.4 * 312e12 * 4) / 86_400
    for plan in record.plans:
        assert plan.train_days is not None
        assert plan.train_days == pytest.approx(days, rel=1e-9)
    (check,) = record.checks
    assert check.possible is False and check.memory is not None and check.throughput is None
    assert check.memory.floor_bytes == pytest.approx((2 + 14 / 4) * 7e9, rel=1e-6)
    assert "impossible" in check.explanation


def test_claim_above_the_floor_is_possible() -> None:
    facts = traced_facts()
    plan = Plan(precision="bf16", zero_stage=3, nproc_per_node=8)
    record = estimate(facts, [plan], claims=[Claim(plan, memory_bytes=15 * 10**9)])
    (check,) = record.checks
    assert check.possible and check.memory is not None
    assert check.memory.floor_bytes == pytest.approx(16 * 7e9 / 8)


def test_plan_grid_keeps_samples_per_device_and_covers_the_knobs() -> None:
    facts = traced_facts()
    grid = plan_grid(facts, Plan(micro_batch=8, nproc_per_node=2))
    assert {p.micro_batch * p.grad_accum for p in grid} == {8}
    assert {p.zero_stage for p in grid} == {0, 1, 2, 3}
    assert {p.checkpoint_blocks for p in grid} == {0, 2, 4}
    assert {p.precision for p in grid} == {"fp32", "amp_bf16", "bf16"}
    assert len(set(grid)) == len(grid)


def test_profile_without_a_fit_still_estimates_its_own_plan() -> None:
    record = make_profile(fit=False)
    facts = facts_from_profile(record)
    assert facts.activations["fp32"].per_sample == record.memory.activations / 4
    assert estimate_plan(facts, Plan(micro_batch=4)).memory.peak == record.memory.peak


def _with_time(record: ProfileRecord, **time: float) -> ProfileRecord:
    return record.model_copy(update={"time": record.time.model_copy(update=time)})


def test_second_batch_size_fits_the_fixed_time_per_micro_batch() -> None:
    base = make_profile(batch=4)
    # at batch 2 the phases take 0.2/0.35 s, not half of 0.3/0.55: 0.1 s and 0.15 s are fixed
    half = _with_time(make_profile(batch=2), dataloader=0.05, forward=0.2, backward=0.35)
    facts = fit_step_time(facts_from_profile(base), half)
    assert facts.baseline is not None
    assert facts.baseline.forward_fixed == pytest.approx(0.1)
    assert facts.baseline.backward_fixed == pytest.approx(0.15)
    assert facts.baseline.dataloader_fixed == pytest.approx(0.05)
    # batch 8: 0.05 + (0.1 + 0.4) + (0.15 + 0.8) + optimizer 0.1 = 1.6 s, step 1.0 s
    ratio = estimate_plan(facts, Plan(micro_batch=8)).predicted_step_time_ratio
    assert ratio == pytest.approx(1.6)
    assert estimate_plan(
        facts_from_profile(base), Plan(micro_batch=8)
    ).predicted_step_time_ratio == pytest.approx(1.9)


def test_a_record_carrying_its_second_batch_predicts_as_the_two_profiles_do() -> None:
    """The timed steps ``autotune profile`` keeps in the record (``second``) split the phases by
    themselves: the hand-worked figures above, with no second profile passed."""
    half = _with_time(make_profile(batch=2), dataloader=0.05, forward=0.2, backward=0.35)
    record = make_profile(batch=4).model_copy(
        update={"second": TimedSteps(config=half.config, time=half.time)}
    )
    facts = facts_from_profile(record)
    assert facts.baseline is not None
    assert facts.baseline.forward_fixed == pytest.approx(0.1)
    assert facts.baseline.backward_fixed == pytest.approx(0.15)
    assert facts.baseline.dataloader_fixed == pytest.approx(0.05)
    assert facts.baseline.time_fit.startswith("fixed + per-sample parts from batch 4 and 2")
    ratio = estimate_plan(facts, Plan(micro_batch=8)).predicted_step_time_ratio
    assert ratio == pytest.approx(1.6)  # 0.05 + (0.1 + 0.4) + (0.15 + 0.8) + 0.1, over 1.0


@pytest.mark.parametrize(("ratio", "at"), [
    # bf16 twice fp32's at micro-batch 4 (an AVX2 CPU, no bf16 matmuls): the fixed 0.25 s
    # (forward 0.1, backward 0.15) kept, the 0.6 s per sample x(2 * 0.85 - 0.25) / 0.6
    (2.0, {2: 0.25 + 0.3 * 1.45 / 0.6, 4: 1.7, 8: 0.25 + 1.2 * 1.45 / 0.6}),
    # bf16 at 0.2x fp32's: 0.17 s, less than the fixed 0.25 s alone: all of it scaled alike
    (0.2, {2: 0.2 * 0.55, 4: 0.17, 8: 0.2 * 1.45}),
])  # fmt: skip
def test_another_precision_scales_the_part_per_sample_as_the_profile_measured(
    ratio: float, at: dict[int, float]
) -> None:
    """The profile's bf16-over-fp32 ratio is of its own micro-batch (4). With the fit's fixed
    part per micro-batch (the operators' dispatch, which a dtype does not change), another
    precision scales the part per sample so the profiled micro-batch keeps the measured ratio;
    other micro-batches follow the line. Forward and backward of the hand fit: 0.25 s fixed and
    0.15 s a sample; data 0.05 s fixed, optimizer 0.1 s."""
    half = _with_time(make_profile(batch=2), dataloader=0.05, forward=0.2, backward=0.35)
    record = make_profile(batch=4).model_copy(
        update={"second": TimedSteps(config=half.config, time=half.time)}
    )
    time = record.time.model_copy(update={"bf16_over_fp32": ratio})
    facts = facts_from_profile(record.model_copy(update={"time": time}))
    for batch, compute in at.items():
        bf16 = estimate_plan(facts, Plan(micro_batch=batch, precision="bf16"))
        assert bf16.predicted_step_seconds == pytest.approx(0.05 + compute + 0.1), batch
    bf16 = estimate_plan(facts, Plan(micro_batch=4, precision="bf16"))
    kept = [n for n in bf16.notes if "operators' own cost per micro-batch kept as measured" in n]
    if ratio > 1:
        assert len(kept) == 1 and "250.0 ms" in kept[0] and "x2.42" in kept[0], kept
    else:
        assert not kept, kept


def test_profile_with_checkpointing_measures_the_recompute_cost() -> None:
    base = make_profile(batch=4)
    ckpt = _with_time(make_profile(batch=4, checkpointing=True), forward=0.3, backward=0.79)
    facts = fit_step_time(facts_from_profile(base), ckpt)
    assert facts.baseline is not None
    assert facts.baseline.recompute_share == pytest.approx(0.24 / (L * 0.3))
    half = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=2)).predicted_step_time_ratio
    assert half == pytest.approx(1.12)


def test_checkpoint_overhead_beyond_the_recomputed_forward_is_fixed_per_block() -> None:
    base = make_profile(batch=4)  # blocks hold ~0.8 of the forward: ~0.06 s a block at batch 4
    ckpt = _with_time(make_profile(batch=4, checkpointing=True), forward=0.3, backward=0.95)
    facts = fit_step_time(facts_from_profile(base), ckpt)
    assert facts.baseline is not None
    # 0.1 s a block measured: 0.06 s recompute (grows with the batch) + 0.04 s fixed
    assert facts.baseline.recompute_share == pytest.approx(0.2, rel=0.01)
    assert facts.baseline.recompute_fixed == pytest.approx(0.04, rel=0.01)
    same = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=L)).predicted_step_time_ratio
    assert same == pytest.approx(1.4)  # the checkpointed profile itself
    half = estimate_plan(facts, Plan(micro_batch=2, checkpoint_blocks=L)).predicted_step_time_ratio
    # data 0.025 + forward 0.15 + backward 0.275 + 4 x (0.2 x 0.15 + 0.04) + optimizer 0.1
    assert half == pytest.approx(0.83, rel=0.01)


@pytest.mark.parametrize(
    "other",
    [
        make_profile(batch=2, checkpointing=True),  # two knobs differ
        make_profile(batch=4),  # nothing differs
    ],
)
def test_fit_step_time_rejects_profiles_that_differ_in_more_or_less_than_one_knob(
    other: ProfileRecord,
) -> None:
    with pytest.raises(ValueError, match="differ"):
        fit_step_time(facts_from_profile(make_profile(batch=4)), other)


def test_a_checkpointed_profile_peaking_in_a_recompute_is_rescaled_there() -> None:
    # what MemTracker shows while block 0 is recomputed: most gradients, the recomputed
    # block's tensors under temporaries, only the kept inputs as activations
    at_peak = AtPeak(
        parameters=4 * P,
        optimizer_states=8 * P,
        gradients=3 * P,
        activations=40_000,
        temporaries=900_000,
    )
    facts = facts_from_profile(make_profile(checkpointing=True, at_peak=at_peak))
    # layers small enough that Adam's step (two temporaries of the largest) stays below
    facts = facts.model_copy(update={"largest_layer_parameters": 50_000})
    same = estimate_plan(facts, Plan(micro_batch=4, checkpoint_blocks=L))
    assert same.memory.peak == 15 * P + 940_000
    assert same.memory.peak_composition.startswith("recompute (measured")
    double = estimate_plan(facts, Plan(micro_batch=8, checkpoint_blocks=L))
    # one block's input + one block at b=8 over the same at b=4: the live tensors double
    assert double.memory.peak == pytest.approx(15 * P + 2 * 940_000, abs=2)


def test_offload_frees_nothing_on_a_cpu_device() -> None:
    # A profile taken on the CPU: host and device are one memory, so an "offloaded"
    # optimizer stays in the peak, exactly as without offload.
    facts = facts_from_profile(make_profile())
    assert facts.device_type == "cpu"
    plan = Plan(zero_stage=2, nproc_per_node=2, micro_batch=4)
    kept = estimate_plan(facts, plan).memory
    offloaded = estimate_plan(facts, plan.with_changes(offload_optimizer="cpu")).memory
    assert offloaded.peak == kept.peak
    assert offloaded.optimizer_states == kept.optimizer_states > 0
    gpu = facts.model_copy(update={"device_type": "cuda"})
    assert estimate_plan(gpu, plan.with_changes(offload_optimizer="cpu")).memory.peak < kept.peak


def test_the_link_between_nodes_times_communication_only_for_plans_over_nodes() -> None:
    facts = facts_from_profile(make_profile())
    over_nodes = Plan(micro_batch=4, zero_stage=2, nproc_per_node=1, nnodes=2)
    one_node = Plan(micro_batch=4, zero_stage=2, nproc_per_node=2)
    slow = estimate_plan(facts, over_nodes, machine=Machine(inter_gbps=10.0, intra_gbps=1000.0))
    fast = estimate_plan(facts, over_nodes, machine=Machine(inter_gbps=100.0, intra_gbps=1000.0))
    assert slow.communication_bytes_per_step == fast.communication_bytes_per_step > 0
    # Same bytes over a link 10x slower: 10x the seconds (bytes * 8 / bits per second).
    expected = slow.communication_bytes_per_step * 8 / 10e9
    assert slow.communication_seconds == pytest.approx(expected)
    assert fast.communication_seconds == pytest.approx(expected / 10)
    inside = estimate_plan(facts, one_node, machine=Machine(inter_gbps=10.0, intra_gbps=1000.0))
    assert inside.communication_seconds == pytest.approx(
        inside.communication_bytes_per_step * 8 / 1000e9
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero3_parts_and_peak_come_from_one_accounting(precision: str) -> None:
    from autotune.estimator._peakmodel import moments
    from autotune.estimator._zero import bucket_elements, zero3_bytes

    facts = traced_facts()
    plan = Plan(precision=precision, zero_stage=3, nproc_per_node=4, micro_batch=2)
    est = estimate_plan(facts, plan)
    engine, parts = zero3_bytes(
        parameters=facts.parameters, trainable=facts.trainable_parameters, precision=precision,
        world_size=4, bucket_elements=bucket_elements(facts.parameters),
        optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
        embedding_parameters=facts.embedding_parameters, gloo=facts.device_type == "cpu",
    )  # fmt: skip
    # The reported parts are ZeRO-3's own: the gathered weights, both gradient partitions, the
    # master and moments.
    assert est.memory.parameters == round(parts.parameters)
    assert est.memory.gradients == round(parts.gradients)
    assert est.memory.optimizer_states == round(parts.optimizer_states)
    # The peak is taken over moments whose states are the same function's, moment by moment.
    step_moments, _, _ = moments(facts, plan)
    for name, held in (("backward", "backward"), ("reduce", "reduce"), ("optimizer", "optimizer")):
        for category in ("parameters", "gradients", "optimizer_states"):
            assert step_moments[name][category] == engine[held][category]
    # and the peak holds at least the states of ZeRO-3's fullest moment (the gathered weights).
    fullest = max(sum(engine[m][c] for c in ("parameters", "gradients", "optimizer_states"))
                  for m in engine)  # fmt: skip
    assert est.memory.peak >= fullest + facts.buffers


def test_the_gloo_overlap_mode_is_stated_beside_zero_1_2_figures_on_cpu() -> None:
    from _profiles import synthetic_profile

    from autotune.estimator import facts_from_profile

    cpu = synthetic_profile(device="cpu")
    psi = cpu.model.trainable_parameters  # from the record, not the facts under test
    facts = facts_from_profile(cpu)

    def overlap_notes(stage: int, ranks: int, on: ModelFacts = facts) -> list[str]:
        plan = Plan(zero_stage=stage, nproc_per_node=ranks)
        return [n for n in estimate_plan(on, plan).notes if "gloo" in n]

    for stage in (1, 2):
        (note,) = overlap_notes(stage, 2)
        assert f"+{4 * psi / 2:,.0f} bytes" in note and "9 of 30" in note
    assert overlap_notes(3, 2) == [] and overlap_notes(2, 1) == []
    assert overlap_notes(2, 2, facts_from_profile(synthetic_profile(device="cuda"))) == []


@pytest.mark.parametrize(("threads", "ranks", "share"), [(2, 2, 2.0), (8, 2, 2.0), (8, 3, 8 / 2),
                                                          (1, 2, 1.0), (None, 2, 1.0)])  # fmt: skip
def test_cpu_ranks_share_the_cores_the_profile_ran_on(
    threads: int | None, ranks: int, share: float
) -> None:
    """A CPU profile on ``threads`` threads; a ZeRO-0 plan of ``ranks`` ranks on that machine
    gives each rank ``threads // ranks`` threads (what the trial launcher sets): its forward,
    backward and optimizer take ``threads / (threads // ranks)`` times the profile's."""
    from autotune.estimator._modelfacts import Baseline

    base = Baseline(plan=Plan(micro_batch=1), peak=0, at_peak=AtPeak(), dataloader=0.05,
                    forward=0.3, backward=0.6, optimizer=0.08, threads=threads)  # fmt: skip
    facts = ModelFacts(name="m", parameters=1000, trainable_parameters=1000,
                       largest_layer_parameters=1000, device_type="cpu", baseline=base,
                       activations={"fp32": ActivationSpec(fixed=0.0, per_sample=1.0,
                                                           source="measured")})  # fmt: skip
    est = estimate_plan(facts, Plan(micro_batch=1, nproc_per_node=ranks))
    assert est.predicted_step_seconds == pytest.approx(0.05 + (0.3 + 0.6 + 0.08) * share)
    on_gpu = estimate_plan(facts.model_copy(update={"device_type": "cuda"}),
                           Plan(micro_batch=1, nproc_per_node=ranks))  # fmt: skip
    assert on_gpu.predicted_step_seconds == pytest.approx(0.05 + 0.3 + 0.6 + 0.08)


def _on_threads(
    threads: int, one_thread_over_all: float | None, cores: int | None = None
) -> ModelFacts:
    record = make_profile()
    record = record.model_copy(update={
        "environment": record.environment.model_copy(update={"threads": threads, "cores": cores}),
        "time": record.time.model_copy(update={"one_thread_over_all": one_thread_over_all}),
    })  # fmt: skip
    return facts_from_profile(record)


@pytest.mark.parametrize(
    ("threads", "measured", "nproc", "factor"),
    [
        (2, None, 2, 2.0),  # not measured: linear in threads
        (2, 1.27, 2, 1.27),  # one thread a rank: the measured ratio itself
        # 4 threads, one took x2.5: serial share s = (4 / 2.5 - 1) / 3 = 0.2; a rank of 2
        # threads: (0.2 + 0.8 / 2) / (0.2 + 0.8 / 4) = 0.6 / 0.4
        (4, 2.5, 2, 1.5),
        (4, 2.5, 1, 1.0),  # one rank keeps the profile's threads
        (2, 2.4, 2, 2.0),  # faster than linear: taken as linear (serial share 0)
        # 4 ranks on a profile's 2 threads: one thread each, two ranks taking turns on a core
        (2, 1.27, 4, 1.27 * 2),
        (2, None, 4, 4.0),
        (1, None, 4, 1.0),  # a profile on one thread says nothing of the machine's cores
    ],
)
def test_a_ranks_compute_on_fewer_cores_follows_the_measured_threads(
    threads: int, measured: float | None, nproc: int, factor: float
) -> None:
    facts = _on_threads(threads, measured)
    plan = Plan(micro_batch=4, nproc_per_node=nproc)
    assert cpu_core_share(facts, plan) == pytest.approx(factor)
    one = estimate_plan(facts, Plan(micro_batch=4))
    assert one.predicted_step_seconds == pytest.approx(1.0)  # the profile's own step, x1
    est = estimate_plan(facts, plan)
    # data 0.05 unchanged; forward 0.3, backward 0.55 and the optimizer 0.1 (ZeRO-0: the whole
    # step on each rank) x the factor; no engine cost measured here
    assert est.predicted_step_seconds == pytest.approx(0.05 + (0.3 + 0.55 + 0.1) * factor)
    # the ratio to the profiled plan (1 rank, its own 1.0 s) follows, its notes naming the factor
    assert est.predicted_step_time_ratio == pytest.approx(est.predicted_step_seconds)
    said = [note for note in est.notes if "share the cores" in note]
    # ranks sharing cores change the time, not where the peak is or how it was found: the same
    # plan from a profile on one thread (nothing to share) peaks at the same moment
    alone = estimate_plan(_on_threads(1, None), plan)
    assert est.memory.peak_composition == alone.memory.peak_composition
    assert est.memory.peak_composition.split(" ", 1)[0] in ("backward", "optimizer")
    if factor == 1.0:
        assert said == []
    else:
        assert len(said) == 1 and f"x{factor:.3g} the profile's" in said[0]


@pytest.mark.parametrize(("cores", "nproc", "factor"), [(2, 2, 1.0), (2, 4, 2.0), (2, 3, 1.5),
                                                       (4, 4, 1.0), (None, 4, 1.0)])  # fmt: skip
def test_ranks_beyond_the_cores_take_turns_on_them(
    cores: int | None, nproc: int, factor: float
) -> None:
    """A profile on one thread (bench/step_time.py profiles as a rank runs) of a machine with
    ``cores``: each rank gets one thread, and ranks beyond the cores share them. On this
    2-core AMD EPYC, 6 plans of 4 ranks each of tiny Llama and tiny GPT measured 11.9 % and
    20.1 % from this (median |error|), 40.7 % and 37.9 % without it (bench/CHANGELOG.md)."""
    facts = _on_threads(1, None, cores)
    plan = Plan(micro_batch=4, nproc_per_node=nproc)
    assert cpu_core_share(facts, plan) == pytest.approx(factor)
    est = estimate_plan(facts, plan)
    assert est.predicted_step_seconds == pytest.approx(0.05 + (0.3 + 0.55 + 0.1) * factor)
    said = [note for note in est.notes if "take turns on the cores" in note]
    assert len(said) == (factor > 1.0)
