"""16-bit-weight plans from an fp32 profile: traced activations replace the formula, and a DeepSpeed
plan without ZeRO holds no gradient when its backward starts."""

from __future__ import annotations

import pytest
from _profiles import HAND_P as P
from _profiles import hand_profile

from autotune.estimator import (
    ActivationSpec,
    estimate_plan,
    facts_from_profile,
    moments,
    with_activations,
)
from autotune.records import AtPeak, Plan

TRACED = ActivationSpec(
    fixed=6_000.0, per_sample=600_000.0, source="traced", path="traced on fake tensors"
)


def test_traced_figures_fill_missing_precisions_and_never_replace_measured_ones() -> None:
    facts = facts_from_profile(hand_profile())
    other = ActivationSpec(fixed=1.0, per_sample=1.0, source="traced")
    merged = with_activations(facts, {"bf16": TRACED, "fp32": other})
    assert merged.activations["bf16"] == TRACED
    assert merged.activations["fp32"] == facts.activations["fp32"]  # the profile's, measured


def test_a_bf16_plan_takes_the_traced_activations_with_their_path() -> None:
    facts = with_activations(facts_from_profile(hand_profile()), {"bf16": TRACED})
    result = estimate_plan(facts, Plan(micro_batch=4, precision="bf16"))
    assert result.source == "traced"
    assert result.memory.activations == 6_000 + 4 * 600_000  # fixed + per sample x b
    assert any("traced on fake tensors" in note for note in result.notes)
    # without it the figures are fp32's halved, and said to be
    formula = estimate_plan(
        facts_from_profile(hand_profile()), Plan(micro_batch=4, precision="bf16")
    )
    assert formula.source == "formula"
    assert formula.memory.activations == (8_000 + 4 * 998_000) // 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_deepspeed_without_zero_holds_its_16_bit_gradients_only_under_accumulation(
    precision: str,
) -> None:
    """deepspeed 0.19 runs a stage-0 16-bit plan on ``FP16_Optimizer`` (engine.py:2321, 2360),
    whose ``.grad`` are torch's and set to None after each step (fp16/fused_optimizer.py:137-145):
    the last micro-batch's backward starts with the earlier ones' 16-bit gradients, 2 bytes per
    parameter, and a single micro-batch's with none. The fp32 gradients (4 per parameter) are
    made in step() (fused_optimizer.py:283-291)."""
    facts = with_activations(facts_from_profile(hand_profile()), {"bf16": TRACED})
    one, _, _ = moments(facts, Plan(micro_batch=4, precision=precision))
    two, _, _ = moments(facts, Plan(micro_batch=4, grad_accum=2, precision=precision))
    assert one["backward"]["gradients"] == 0.0
    assert two["backward"]["gradients"] == 2 * P
    assert one["optimizer"]["gradients"] == (2 + 4) * P


@pytest.mark.parametrize("ratio", [0.5, 1.0])
def test_backwards_temporaries_follow_the_traced_loss_dtype(ratio: float) -> None:
    """The profile peaked at the start of backward with 400,000 B of temporaries (the loss's
    gradient buffers, fp32). Under bf16 weights they are bf16 where the loss takes bf16 logits
    (BERT, T5: traced ratio 0.5) and stay fp32 where the model upcasts them (Llama: 1.0)."""
    plan = Plan(micro_batch=32, precision="bf16")  # large enough to peak in backward
    base = with_activations(facts_from_profile(hand_profile()), {"bf16": TRACED})
    traced = {"bf16": TRACED.model_copy(update={"temporaries_vs_fp32": ratio})}
    scaled = with_activations(facts_from_profile(hand_profile()), traced)
    dropped = estimate_plan(base, plan).memory.peak - estimate_plan(scaled, plan).memory.peak
    assert estimate_plan(scaled, plan).memory.peak_composition.startswith("backward")
    # one per sample: 400,000 B at the profile's micro-batch 4, x 32 / 4 here
    assert dropped == pytest.approx(400_000 * 32 / 4 * (1 - ratio), abs=2)


def test_optimizer_step_temporaries_keep_their_fp32_bytes() -> None:
    """Adam's transients at the step work on DeepSpeed's fp32 master: no dtype ratio there."""
    at_step = AtPeak(parameters=4 * P, gradients=4 * P, optimizer_states=8 * P, temporaries=300_000)
    plan = Plan(micro_batch=4, precision="bf16")
    traced = {"bf16": TRACED.model_copy(update={"temporaries_vs_fp32": 0.5})}
    plain = with_activations(facts_from_profile(hand_profile(at_peak=at_step)), {"bf16": TRACED})
    halved = with_activations(facts_from_profile(hand_profile(at_peak=at_step)), traced)
    assert estimate_plan(plain, plan).memory.peak == estimate_plan(halved, plan).memory.peak
