"""A second independent reference for the peak: torch's own ``MemTracker`` around a hand-written
step (private, but shipped; the torch range in pyproject.toml is the one it was checked with).

torch.profiler's timeline also sees allocations that are no tensor (oneDNN's convolution
scratch): where it disagrees with the live-tensor tracker, MemTracker says which side the
tensors are on.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from _reference import load_module


def memtracker_peak(path: Path, batch_size: int) -> int | None:
    """MemTracker's peak (CPU, all categories) of the second of two AdamW steps of a model file
    whose ``build_model`` returns a model taking ``**batch`` with a ``.loss``; ``None`` where
    MemTracker refuses the model (a frozen parameter: it hooks every parameter's gradient)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    module = load_module(path)
    torch.manual_seed(0)
    model = module.build_model()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    batches = (module.build_batch(batch_size) for _ in itertools.count())

    def step() -> None:
        loss = model(**next(batches)).loss
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    if not all(p.requires_grad for p in model.parameters()):
        return None
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")
    cpu = next(device for device in peak if device.type == "cpu")
    return int(peak[cpu]["Total"])
