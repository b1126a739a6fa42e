"""Checkpointing is for fitting, or for a larger micro-batch predicted faster (METHOD.md section 5):
never for a step that fits with no micro-batch to gain. A CPU's budget is its available memory."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from _profiles import GB, synthetic_profile

from autotune.estimator import estimate_plan, facts_from_profile, fit_step_time
from autotune.policy import suggest
from autotune.records import Machine, Plan, ProfileRecord

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
