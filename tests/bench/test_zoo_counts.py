"""bench/zoo.py counts a failed step as a failure, and heads its summary with the independent
comparison (the live-tensor tracker against torch.profiler), not the profiler against itself."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import zoo  # noqa: E402

MIB = 2**20
GOOD = zoo.Row(
    name="bert", family="encoder", parameters=1000, measured=10 * MIB,
    peak_source="cpu_allocator", reference=10 * MIB, allocator=10 * MIB,
    live_tensors=10 * MIB, memtracker=10 * MIB, estimate=10 * MIB,
    path="traced on fake tensors", profile_s=0.1, estimate_s=0.2,
)  # fmt: skip


def test_a_failed_estimate_lowers_the_success_count_and_is_listed() -> None:
    failed = replace(
        GOOD, name="vit", estimate=None, path=None, estimate_s=None,
        errors=("estimate: RuntimeError: no trace",),
    )  # fmt: skip
    text = zoo.table([GOOD, failed])
    assert "estimate succeeded: 1/2" in text
    assert "profile succeeded: 2/2" in text
    assert "estimate vs measured within 5 %: 1/1" in text  # only where both figures exist
    assert "- vit failed: estimate: RuntimeError: no trace" in text


def test_the_headline_is_the_independent_comparison() -> None:
    off = replace(GOOD, name="convnext", live_tensors=5 * MIB)
    lines = zoo.summary([GOOD, off])
    assert lines[1] == (
        "live-tensor tracker vs torch.profiler within 2 % (independent instruments): 1/2"
    )
    same = next(line for line in lines if line.startswith("measured vs torch.profiler"))
    assert "same instrument" in same and same.endswith(": 2/2")


def test_measure_keeps_a_row_when_every_step_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(zoo, "_estimate", broken)
    monkeypatch.setattr(zoo, "_run", broken)
    row = zoo.measure("bert")
    assert row.errors == ("estimate: RuntimeError: boom", "model file: RuntimeError: boom")
    assert row.measured is None and row.estimate is None and row.parameters is None
    assert "profile succeeded: 0/1; reference succeeded: 0/1; estimate succeeded: 0/1" in (
        zoo.table([row])
    )


def test_an_unknown_model_name_is_refused() -> None:
    with pytest.raises(SystemExit):
        zoo._arguments(["no_such_model"])
