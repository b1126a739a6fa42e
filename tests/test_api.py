"""The composition's prediction, as ``autotune tune`` prunes with it."""

from __future__ import annotations

from _profiles import hand_profile

from autotune.compose import compose
from autotune.records import Machine, Plan


def make_predict(profile, machine):  # noqa: ANN001, ANN201 - the tune road's prediction
    return compose(profile, machine=machine).prediction


def test_the_margin_decides_what_tune_prunes() -> None:
    profile, plan = hand_profile(), Plan(micro_batch=4)
    peak = make_predict(profile, Machine())(plan).peak_bytes
    budget = int(peak / 0.95)  # the predicted peak is 95 % of the budget
    assert make_predict(profile, Machine(device_memory=budget, margin=0.0))(plan).fits
    assert make_predict(profile, Machine(device_memory=budget, margin=0.04))(plan).fits
    assert not make_predict(profile, Machine(device_memory=budget, margin=0.06))(plan).fits
    default = make_predict(profile, Machine(device_memory=budget))(
        plan
    )  # 10 %, as `autotune tune` without --margin
    assert not default.fits and "usable part" in (default.reason or "")
    # The margin moves the line, never the peak.
    assert make_predict(profile, Machine(device_memory=budget, margin=0.0))(plan).peak_bytes == peak
