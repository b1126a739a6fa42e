"""The physical bounds of a profile's figures: what cannot be true is flagged, what can is not."""

from __future__ import annotations

from typing import Any

import pytest
from _profiles import synthetic_profile

from autotune.estimator import (
    BF16_RATIO_FIGURE,
    HFU_FIGURE,
    MFU_FIGURE,
    SPREAD_FIGURE,
    bf16_ratio_problem,
    check_figures,
    flagged_figures,
)
from autotune.estimator._bounds import GPU_BF16_RATIO_MAX
from autotune.records import ProfileRecord, Spread


@pytest.mark.parametrize(
    ("ratio", "device", "impossible"),
    [
        (56.74, "cpu", True),   # the loaded machine
        (2.4, "cpu", False),    # AMX, as measured here
        (0.05, "cpu", False),   # AVX2: bf16 emulated, 20x slower
        (17.0, "cpu", True),    # beyond AMX's 16x
        (14.0, "cuda", False),  # H100: 989 / 67 TFLOPS
        (56.74, "cuda", True),
        (1e-4, "cuda", True),   # a stall, not a kernel
        (None, "cpu", False),   # not measured: nothing to judge
    ],
)  # fmt: skip
def test_bf16_ratio_bounds_per_device_kind(
    ratio: float | None, device: str, impossible: bool
) -> None:
    assert (bf16_ratio_problem(ratio, device) is not None) is impossible


def test_the_gpu_bound_comes_from_the_peak_table() -> None:
    bound = GPU_BF16_RATIO_MAX
    assert bound == pytest.approx(1.25 * 312 / 19.5) == 20.0  # A100, the largest ratio


def _profile(
    *, mfu: float | None = None, hfu: float | None = None, ratio: float | None = 2.4,
    spread: tuple[float, float, float] = (0.9, 1.0, 1.2), device: str = "cpu",
) -> ProfileRecord:  # fmt: skip
    base = synthetic_profile(device=device, bf16_ratio=ratio)
    low, median, high = spread
    return base.model_copy(
        update={
            "compute": base.compute.model_copy(update={"mfu": mfu, "hfu": hfu}),
            "time": base.time.model_copy(
                update={"spread": Spread(min=low, p25=low, median=median, p75=high, max=high)}
            ),
        }
    )


@pytest.mark.parametrize(
    ("knobs", "flagged"),
    [
        ({"mfu": 0.45, "hfu": 0.6}, set()),
        ({"mfu": 1.0}, set()),
        ({"mfu": 1.612}, {MFU_FIGURE}),
        ({"mfu": 0.9, "hfu": 1.2}, {HFU_FIGURE}),
        ({"mfu": 0.0}, {MFU_FIGURE}),
        ({"ratio": 56.74}, {BF16_RATIO_FIGURE}),
        ({"spread": (0.5, 1.0, 1.6)}, {SPREAD_FIGURE}),
        ({"spread": (0.9, 1.0, 1.35)}, set()),  # ordinary noise on a shared machine
        ({"mfu": 1.612, "ratio": 56.74}, {MFU_FIGURE, BF16_RATIO_FIGURE}),
    ],
)
def test_figures_outside_their_bounds_are_flagged(knobs: dict[str, Any], flagged: set[str]) -> None:
    assert set(check_figures(_profile(**knobs))) == flagged


def test_a_profile_s_own_flags_are_kept_and_an_old_record_is_checked_when_read() -> None:
    # An older record has no flags field: the check still finds its impossible figures.
    data = _profile(mfu=1.612).model_dump(mode="json")
    del data["flags"]
    old = ProfileRecord.model_validate(data)
    assert old.flags == {} and "161.2%" in flagged_figures(old)[MFU_FIGURE]
    refused = {BF16_RATIO_FIGURE: "refused after measuring twice"}
    new = _profile(ratio=None).model_copy(update={"flags": refused})
    assert flagged_figures(new) == refused
