"""tune's two short profiles: the second refines the step time only, so it pays for no probe."""

from __future__ import annotations

from pathlib import Path

from autotune.compose._sources import short_profiles

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_second_short_profile_leaves_the_probes_to_the_first() -> None:
    first, second = short_profiles(EXAMPLES / "mlp_dataloader.py", per_rank=8, device="cpu")
    assert second is not None and second.config.batch_size > first.config.batch_size
    # the first measured both: the host's Adam rate and the model's bf16 / fp32 compute
    assert first.environment.host_adam_per_s and first.time.bf16_over_fp32
    # the second says why it has neither, instead of measuring them again
    assert second.environment.host_adam_per_s is None and second.time.bf16_over_fp32 is None
    reasons = second.environment.unavailable
    assert "not probed" in reasons["host_adam_per_s"]
    assert "not probed" in reasons["time.bf16_over_fp32"]
