"""tune's two short profiles: the second is timed steps alone, so it pays for no memory
measure, FLOP count or probe, and the step-time fit reads it as it reads a whole profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.compose._sources import short_profiles
from autotune.estimator import facts_from_profile, fit_step_time
from autotune.records import ProfileRecord, TimedSteps

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_second_short_profile_times_steps_and_fits_like_a_whole_profile() -> None:
    model = EXAMPLES / "mlp_dataloader.py"
    first, second = short_profiles(model, per_rank=8, device="cpu")
    assert isinstance(second, TimedSteps) and not isinstance(second, ProfileRecord)
    assert second.config.batch_size == 4 * first.config.batch_size
    # the first measured the probes; the second carries step times only
    assert first.environment.host_adam_per_s and first.time.bf16_over_fp32
    assert second.time.steps_measured == second.config.steps
    # the fit splits the forward into a part per micro-batch and one per sample, through the
    # two measured points (the line through them, at batch 0, clamped to [0, the first's])
    base = fit_step_time(facts_from_profile(first), second).baseline
    assert base is not None
    b0, b1 = first.config.batch_size, second.config.batch_size
    f0, f1 = first.time.forward, second.time.forward
    at_zero = f0 - (f1 - f0) / (b1 - b0) * b0
    assert base.forward_fixed == pytest.approx(min(max(at_zero, 0.0), f0))
    assert f"profile at batch {b1}" in base.time_fit
