"""Checkpointing is for fitting, or for a larger micro-batch predicted faster (METHOD.md section 5):
never for a step that fits with no micro-batch to gain. A CPU's budget is its available memory."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from _profiles import GB, synthetic_profile

from autotune.estimator import estimate_plan, facts_from_profile, fit_step_time
from autotune.policy import suggest
from autotune.records import ActivationRecord, Machine, Plan, ProfileRecord, format_bytes

CPU: dict[str, Any] = {"device": "cpu", "bf16_ratio": 0.15}


@pytest.fixture(autouse=True)
def available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.records._machine.available_memory", lambda: 64 * GB)


def _checkpointing(record: Any) -> list[Any]:
    return [s for s in record.suggestions if "checkpoint_blocks" in s.change]


def _per_sample_seconds(profiles: list[ProfileRecord], plan: Plan) -> float:
    """The estimator's own prediction for a plan, per sample (the reference the policy must meet)."""
    facts = facts_from_profile(profiles[0])
    for other in profiles[1:]:
        facts = fit_step_time(facts, other)
    ratio = estimate_plan(facts, plan).predicted_step_time_ratio
    assert ratio is not None
    return ratio / plan.global_batch


# Activations from a small to a dominating share of the step; budgets all comfortably above
# the peak; with and without a target global batch; CPU (no budget given) and GPU.
SHARES = [0.01 * GB, 0.5 * GB, 2 * GB, 6 * GB]
MACHINES: list[dict[str, Any]] = [
    {"profile": CPU, "options": {}},
    {"profile": CPU, "options": {"global_batch": 64}},
    {"profile": {}, "options": {"device_memory": 1000 * GB}},
    {"profile": {}, "options": {"device_memory": 1000 * GB, "global_batch": 256}},
    {"profile": {}, "options": {"device_memory": 1000 * GB, "world_size": 8}},
]


@pytest.mark.parametrize(("activations", "machine"), list(itertools.product(SHARES, MACHINES)))
@pytest.mark.parametrize("second_profile", [False, True])
def test_never_for_a_step_that_fits_with_no_micro_batch_to_gain(
    activations: float, machine: dict[str, Any], second_profile: bool
) -> None:
    knobs = {**machine["profile"], "activations_per_sample": activations}
    profiles = [synthetic_profile(**knobs)]
    if second_profile:
        # Time proportional to the batch (no fixed part): no micro-batch is faster per sample.
        profiles.append(synthetic_profile(**knobs, batch_size=4, step=0.5))
    record = suggest(profiles[0], more_profiles=profiles[1:], **machine["options"])
    assert record.device_memory_bytes is not None  # a CPU profile gets this machine's memory
    assert _checkpointing(record) == [], [s.change for s in record.suggestions]


def test_checkpointing_buys_a_larger_micro_batch_only_when_predicted_faster() -> None:
    # 2 GB of activations per sample, 30 GB of budget: micro-batch 8 fits, 16+ only with
    # checkpointing. A fixed 0.6 s per micro-batch makes the larger micro-batch faster.
    knobs = {**CPU, "activations_per_sample": 2 * GB}
    base = synthetic_profile(**knobs, batch_size=8, step=1.0)
    other = synthetic_profile(**knobs, batch_size=4, step=0.8)
    record = suggest(base, more_profiles=[other], device_memory=30 * GB, global_batch=64)
    (proposal,) = _checkpointing(record)
    assert proposal.evidence["fits"].value is True
    plan = proposal.plan
    assert plan.micro_batch > 8 and plan.checkpoint_blocks > 0 and proposal.predicted.fits_after
    # Against the estimator: faster per sample than every plan without checkpointing that fits.
    fitting = [Plan(micro_batch=m, grad_accum=64 // m) for m in (1, 2, 4, 8)]
    best_plain = min(_per_sample_seconds([base, other], p) for p in fitting)
    assert _per_sample_seconds([base, other], plan) < best_plain
    # Fewest blocks: one fewer does not fit.
    fewer = estimate_plan(
        fit_step_time(facts_from_profile(base), other),
        plan.with_changes(checkpoint_blocks=plan.checkpoint_blocks - 1),
        machine=Machine(device_memory=30 * GB),
    )
    assert fewer.fits is False


def test_a_cpu_budget_is_the_available_memory_stated_as_such() -> None:
    record = suggest(synthetic_profile(**CPU))
    assert record.device_memory_bytes == 64 * GB and record.budget_source == "available_ram"
    assert any("available memory (psutil)" in note for note in record.notes)
    given = suggest(synthetic_profile(**CPU), device_memory=8 * GB)
    assert given.budget_source == "given" and given.device_memory_bytes == 8 * GB


def test_checkpointing_to_fit_is_still_proposed() -> None:
    record = suggest(synthetic_profile(**CPU, activations_per_sample=10 * GB))
    (proposal,) = _checkpointing(record)
    assert proposal.evidence["fits"].value is False and proposal.predicted.fits_after
    assert "micro_batch" not in proposal.change


def _slow_bf16_profile() -> ProfileRecord:
    """A CPU profile whose bf16 matmuls run at 0.01x fp32's speed (an AVX2-only CPU measured
    0.0097x) and whose trace says bf16 autocast halves the saved activations."""
    profile = synthetic_profile(device="cpu", bf16_ratio=0.01, parameters=10_000_000, layers=4,
                                activations_per_sample=0.5 * GB)  # fmt: skip
    fp32 = profile.memory.activation_fit
    assert fp32 is not None
    amp = ActivationRecord(fixed=0, per_sample=fp32.per_sample / 2,
                           block_per_sample=fp32.block_per_sample / 2,
                           block_input_per_sample=fp32.block_input_per_sample / 2,
                           source="traced")  # fmt: skip
    memory = profile.memory.model_copy(update={"traced": {"amp_bf16": amp}})
    return profile.model_copy(update={"memory": memory})


def _peak_and_time(profile: ProfileRecord, plan: Plan) -> tuple[float, float]:
    """The estimator's own predicted peak and step-time ratio for a plan (the reference)."""
    est = estimate_plan(facts_from_profile(profile), plan)
    assert est.predicted_step_time_ratio is not None
    return est.memory.peak, est.predicted_step_time_ratio


def test_slow_bf16_autocast_is_not_proposed_for_memory_where_checkpointing_fits() -> None:
    """Autocast on a device without fast bf16 lowers the peak but slows every matmul; a
    checkpointed block costs one more forward of it. Where checkpointing alone fits, the policy
    checkpoints in fp32; autocast for memory is left to steps that nothing checkpointed fits."""
    profile = _slow_bf16_profile()
    base, amp = Plan(micro_batch=8), Plan(micro_batch=8, precision="amp_bf16")
    (base_peak, base_time), (amp_peak, amp_time) = (_peak_and_time(profile, p) for p in (base, amp))
    assert amp_peak < 0.95 * base_peak and amp_time > 10 * base_time  # what the rule weighs
    usable = 0.9 * base_peak  # the baseline does not fit; 2 of 4 blocks checkpointed do
    record = suggest(profile, device_memory=int(usable / 0.9))
    assert [s.rule for s in record.suggestions] == ["activation_checkpointing"]
    final = record.final_plan
    assert final.precision == "fp32" and final.checkpoint_blocks > 0
    final_peak, final_time = _peak_and_time(profile, final)
    assert final_peak <= usable and final_time < amp_time / 5
    # A budget that no checkpointing reaches in fp32 but autocast's lower activations do
    # with every block checkpointed: autocast comes first, then the blocks.
    full = Plan(micro_batch=8, checkpoint_blocks=4)
    fp32_full, amp_full = (_peak_and_time(profile, p)[0] for p in (full, full.with_changes(
        precision="amp_bf16")))  # fmt: skip
    assert amp_full < fp32_full
    tight = suggest(profile, device_memory=int((amp_full + fp32_full) / 2 / 0.9))
    assert [s.rule for s in tight.suggestions][:2] == [
        "mixed_precision_for_memory", "activation_checkpointing"]  # fmt: skip
    assert tight.suggestions[1].predicted.fits_after


def test_a_final_plan_that_does_not_fit_says_so() -> None:
    """A budget below the model states: no rule reaches it, and the notes say the final plan
    does not fit with the estimator's own peak, not that it "exists to fit"."""
    profile = _slow_bf16_profile()
    states = 16 * 10_000_000  # fp32 weights, gradients and Adam's two moments
    record = suggest(profile, device_memory=states // 2)
    peak = estimate_plan(facts_from_profile(profile), record.final_plan).memory.peak
    unfit = [note for note in record.notes if "not to fit" in note]
    assert unfit == [f"the final plan is predicted not to fit: peak {format_bytes(peak)} over the "
                     f"usable {format_bytes(states // 2 * 0.9)}; no rule of the policy reaches "
                     "the budget"]  # fmt: skip
    assert not any("it exists to fit" in note for note in record.notes)
    (slower,) = [note for note in record.notes if "the baseline's time per sample" in note]
    assert slower.endswith(f" to {format_bytes(peak)}, still over the budget")
