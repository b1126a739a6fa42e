"""Interleaved A/B measurement of two plans with real training steps (what ``confirm`` injects)."""

from __future__ import annotations

import statistics
from typing import Any

from autotune.records import AutotuneError, NotApplicable, Plan
from autotune.runtime import _device as dev
from autotune.runtime._step import TrainRunner, runner_for_plan
from autotune.runtime.modelfile import ModelFile

_PREFETCH_FACTOR = 2  # DataLoader's default: batches each worker keeps ready


def measure(
    model_file: ModelFile,
    before: Plan,
    after: Plan,
    *,
    device: str,
    steps: int,
    repeats: int,
    warmup: int,
) -> dict[str, Any]:
    """Interleaved A/B repeats of ``steps`` steps each; paired time ratios and mean losses.

    Both arms are built from the same seed and read the same batches in the
    same order, so their losses over the same steps are comparable.

    Raises:
        NotApplicable: ``after`` changes a loader knob this model file cannot take.
    """
    if steps < 1 or repeats < 1:
        raise AutotuneError("--steps and --repeats must be at least 1")
    blocked = loader_change_blocked(model_file, before, after)
    if blocked is not None:
        # Both arms would read batches the same way: an A/B of two identical plans.
        raise NotApplicable(blocked)
    arms = (
        runner_for_plan(model_file, before, device=device),
        runner_for_plan(model_file, after, device=device),
    )
    # Workers fill their prefetch queue while the other arm runs; draining it untimed
    # keeps a loader change from being credited with batches made in the other arm's turn.
    # Both arms settle alike so they keep reading the same batches at the same steps.
    settle = max(before.dataloader_workers, after.dataloader_workers) * _PREFETCH_FACTOR
    try:
        for arm in arms:
            for _ in range(warmup):
                arm.step()
        times: tuple[list[float], list[float]] = ([], [])
        losses: tuple[list[float], list[float]] = ([], [])
        peaks: list[list[int]] = [[], []]
        for repeat in range(repeats):
            # Alternate which arm goes first so drift in machine load hits both alike.
            for index in (0, 1) if repeat % 2 == 0 else (1, 0):
                seconds, loss, peak = _block(arms[index], steps, settle)
                times[index].append(seconds)
                losses[index].extend(loss)
                if peak is not None:
                    peaks[index].append(peak)
    finally:
        for arm in arms:
            arm.close()
    return {
        "ratios": [b / a for a, b in zip(*times, strict=True)],
        "before_step_s": statistics.median(times[0]),
        "after_step_s": statistics.median(times[1]),
        "loss_before": statistics.fmean(losses[0]),
        "loss_after": statistics.fmean(losses[1]),
        "peak_bytes_before": max(peaks[0]) if peaks[0] else None,
        "peak_bytes_after": max(peaks[1]) if peaks[1] else None,
    }


def loader_change_blocked(model_file: ModelFile, before: Plan, after: Plan) -> str | None:
    """Why the loader knobs ``after`` changes cannot be applied to this file (``None``: they can,
    or it changes none)."""
    knobs = ("dataloader_workers", "pin_memory")
    if all(getattr(before, knob) == getattr(after, knob) for knob in knobs):
        return None
    return model_file.loader_knobs_blocked(after.micro_batch)


def _block(runner: TrainRunner, steps: int, settle: int) -> tuple[float, list[float], int | None]:
    """Mean seconds per step over ``steps`` timed steps after ``settle`` untimed ones, losses, CUDA peak."""
    for _ in range(settle):
        runner.step()
    dev.reset_peak_memory(runner.device)
    timings = [runner.step() for _ in range(steps)]
    peaks = dev.allocator_peak(runner.device)
    peak = None if peaks is None else peaks[0]
    return statistics.fmean(t.total for t in timings), [t.loss for t in timings], peak
