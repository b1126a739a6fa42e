"""Runs emitted FSDP2 code on a tiny block stack in each rank; run by torchrun.

``torchrun --standalone --nproc_per_node=2 tests/emit/_fsdp2_two_rank.py CODES.json OUT.json``
executes every ``{"name", "code"}`` of CODES.json on a fresh 4-block residual MLP
(``tests/_models.py``), runs one forward and backward and an optimizer step, and has
rank 0 write ``{name: {"calls", "sharded", "loss"}}`` to OUT.json: ``calls`` counts,
per block, how often its first layer ran (2 for a block recomputed by checkpointing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.runtime.trial.steps import leave_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _models import mlp_stack  # noqa: E402

BLOCKS = 4


def run(code: str) -> dict[str, Any]:
    """Build the model, execute ``code`` as a user's script would, and take one step."""
    from torch.distributed.fsdp import FSDPModule

    scope: dict[str, Any] = {}
    exec(mlp_stack(blocks=BLOCKS), scope)  # noqa: S102 - the shared model file
    torch.manual_seed(0)
    model = scope["build_model"]()
    calls = [0] * BLOCKS
    for index, block in enumerate(model.blocks):
        block.up.register_forward_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    user: dict[str, Any] = {"model": model}
    exec(code, user)  # noqa: S102 - the emitted lines, run as a user would
    batch = scope["build_batch"](8)
    loss = scope["loss_fn"](model, batch)
    loss.backward()
    user["optimizer"].step()
    return {
        "calls": calls,
        "sharded": [isinstance(block, FSDPModule) for block in model.blocks],
        "loss": float(loss.detach()),
    }


def main() -> None:
    dist.init_process_group("gloo")
    codes = json.loads(Path(sys.argv[1]).read_text())
    results = {item["name"]: run(item["code"]) for item in codes}
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(results))
    # CI saw a rank abort at exit once in this test ("terminate called without an active
    # exception": leave_ranks says why).
    leave_ranks()


if __name__ == "__main__":
    main()
