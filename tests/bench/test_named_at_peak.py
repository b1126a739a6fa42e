"""bench/_zero_rank.py names the blocks alive at a measured step's peak by the ops that made them."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # where the bench finds the profiler reference
sys.path.insert(0, str(REPO / "bench"))

import _zero_rank  # noqa: E402

BIG = 8 * 2**20  # bytes of the block the step holds at its peak


def test_the_named_blocks_at_the_peak_add_up_to_the_reference_and_name_their_op() -> None:
    model = torch.nn.Linear(256, 256)
    before = _zero_rank.storages()

    def step() -> None:
        with torch.profiler.record_function("held_block"):
            held = torch.empty(BIG // 4)  # float32
        loss = model(torch.randn(64, 256)).square().sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        del held

    measured = _zero_rank._measure_cpu(step, before, categories=False)
    named = {name: mib for mib, name in measured["named"]}
    assert named["aten::empty < held_block"] == BIG / 2**20
    # the groups are the high bound's replay: they add up to it, less MiB rounding
    assert abs(sum(named.values()) - measured["reference"] / 2**20) <= 0.01 * len(named)
    assert measured["low"] == measured["reference"]  # one thread: every free is seen
