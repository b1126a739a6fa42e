"""bench/tune_quality.py's grid is the same whatever precision tune picked: fp32 and bf16 both,
each with both engines."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from tune_quality import grid_space  # noqa: E402

from autotune.records import Plan  # noqa: E402


@pytest.mark.parametrize("picked", ["fp32", "bf16"])
def test_the_grid_has_both_precisions_and_engines_whichever_the_pick_has(picked: str) -> None:
    pick = Plan(precision=picked, micro_batch=16, nproc_per_node=2)  # type: ignore[arg-type]
    plans = grid_space(32, 2, 2, pick).all_plans()
    # 2 ranks x global batch 32: mb 1, 2, 4, 8, 16 per rank; 0-2 blocks checkpointed; ZeRO 0-3
    # by DeepSpeed, stages 2 and 3 by FSDP2 (its stage 1 is its stage 2), as tune searches them.
    engine_stages = [("deepspeed", s) for s in range(4)] + [("fsdp2", 2), ("fsdp2", 3)]
    expected = {
        (precision, engine, stage, mb, 16 // mb, blocks)
        for precision, (engine, stage), mb, blocks in itertools.product(
            ("fp32", "bf16"), engine_stages, (1, 2, 4, 8, 16), range(3)
        )
    }
    found = {(p.precision, p.engine, p.zero_stage, p.micro_batch, p.grad_accum,
              p.checkpoint_blocks) for p in plans}  # fmt: skip
    assert found == expected and len(plans) == 2 * 6 * 5 * 3
