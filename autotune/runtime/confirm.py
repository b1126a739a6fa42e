"""Confirm the policy's changes one at a time with real, interleaved A/B training steps."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune._errors import AutotuneError
from autotune._suggest import ConfirmRecord, ConfirmStep, Measured, Suggestion, suggest
from autotune.plan import Plan
from autotune.policy._verdict import decide
from autotune.records import ProfileRecord
from autotune.runtime.modelfile import ModelFile, load_model_file
from autotune.runtime.step import AUTOCAST, TrainRunner, runner_for_plan

Progress = Callable[[str], None]
_IN_PROCESS = {
    "precision",
    "checkpoint_blocks",
    "micro_batch",
    "grad_accum",
    "dataloader_workers",
    "pin_memory",
    "attention",
    "compile",
}
_PREFETCH_FACTOR = 2  # DataLoader's default: batches each worker keeps ready


def confirm(
    model_path: str | Path,
    *,
    batch_size: int,
    profile: ProfileRecord | None = None,
    device: str = "cpu",
    steps: int = 3,
    repeats: int = 5,
    warmup: int = 1,
    loss_tolerance: float = 0.05,
    max_changes: int = 8,
    progress: Progress | None = None,
    **suggest_options: Any,
) -> ConfirmRecord:
    """Profile a baseline, then measure each proposed change against what was kept so far.

    Args:
        model_path: the user's model file.
        batch_size: micro-batch of the baseline.
        profile: a saved baseline profile (default: profile the model now).
        device: where the steps run (``cpu``, ``cuda``, ``cuda:1``).
        steps: timed steps per arm in each repeat.
        repeats: interleaved A/B repeats (the interval comes from their spread).
        warmup: untimed steps per arm before the first repeat.
        loss_tolerance: largest relative difference of the mean loss accepted.
        max_changes: most changes proposed in one session.
        progress: called with one line per event (the CLI prints them to stderr).
        **suggest_options: passed to :func:`autotune._suggest.suggest` (device_memory, policy_path...).

    Returns:
        The session log: every change proposed, predicted, measured, kept or rejected.
    """
    say = progress or (lambda line: None)
    model_file = load_model_file(model_path)
    profile = _baseline_profile(model_path, profile, batch_size, device, steps, warmup, say)
    kept: Plan | None = None
    skip: set[str] = set()
    log: list[ConfirmStep] = []
    baseline: Plan | None = None
    for _ in range(max_changes):
        record = suggest(profile, start=kept, skip_rules=skip, **suggest_options)
        baseline = baseline or record.baseline
        if not record.suggestions:
            break
        proposal = record.suggestions[0]
        current = kept or record.baseline
        say(f"{proposal.rule}: trying {_change_text(proposal)} on {current.describe()}")
        step = _try(model_file, current, proposal, device, steps, repeats, warmup, loss_tolerance)
        say(f"{proposal.rule}: {step.status}: {step.why}")
        log.append(step)
        if step.status == "kept":
            kept = proposal.plan
        else:
            skip.add(proposal.rule)
    start = baseline or Plan(micro_batch=batch_size)
    return ConfirmRecord(
        model_file=str(model_path),
        device=device,
        baseline=start,
        final_plan=kept or start,
        loss_tolerance=loss_tolerance,
        steps=log,
        notes=_notes(log),
    )


def _baseline_profile(
    model_path: str | Path,
    profile: ProfileRecord | None,
    batch_size: int,
    device: str,
    steps: int,
    warmup: int,
    say: Progress,
) -> ProfileRecord:
    """The saved profile (checked against ``batch_size``), or a fresh fp32 one."""
    if profile is not None:
        if profile.config.batch_size != batch_size:
            raise AutotuneError(
                f"--batch-size {batch_size} differs from the profile's batch size "
                f"{profile.config.batch_size}"
            )
        return profile
    from autotune.runtime.profiler import profile as run_profile

    say(f"profiling the baseline at batch size {batch_size}")
    return run_profile(
        model_path, batch_size=batch_size, steps=max(steps, 3), warmup=warmup,
        device=device, precision="fp32", checkpointing=False,
    )  # fmt: skip


def _try(
    model_file: ModelFile,
    current: Plan,
    proposal: Suggestion,
    device: str,
    steps: int,
    repeats: int,
    warmup: int,
    tolerance: float,
) -> ConfirmStep:
    """Measure one proposal and decide; changes that need DeepSpeed are only recorded."""
    common = {"rule": proposal.rule, "change": proposal.change, "plan": proposal.plan}
    outside = sorted(set(proposal.change) - _IN_PROCESS)
    if outside or proposal.plan.precision not in AUTOCAST:
        knobs = ", ".join(outside) or f"precision={proposal.plan.precision}"
        why = f"{knobs} needs DeepSpeed engines: cannot be confirmed in-process (`autotune tune` measures it)"
        return ConfirmStep(
            **common, predicted=proposal.predicted, status="not_confirmable", why=why
        )
    try:
        measured = measure(
            model_file,
            current,
            proposal.plan,
            device=device,
            steps=steps,
            repeats=repeats,
            warmup=warmup,
        )
    except (RuntimeError, NotImplementedError) as exc:
        # A change the model cannot take (e.g. no such attention kernel) is a rejection, not a crash.
        why = f"could not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return ConfirmStep(**common, predicted=proposal.predicted, status="rejected", why=why)
    fits = proposal.evidence.get("fits")
    needed = bool(fits and fits.value is False and proposal.predicted.fits_after)
    ratios = list(measured.pop("ratios"))
    verdict = decide(
        ratios,
        measured["loss_before"],
        measured["loss_after"],
        loss_tolerance=tolerance,
        needed_to_fit=needed,
    )
    result = Measured(
        **measured,
        repeats=repeats,
        steps_per_repeat=steps,
        step_time_ratio=verdict.ratio,
        ratio_interval=verdict.interval,
        loss_delta=verdict.loss_delta,
    )
    status = "kept" if verdict.kept else "rejected"
    return ConfirmStep(
        **common, predicted=proposal.predicted, measured=result, status=status, why=verdict.why
    )


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
    """
    if steps < 1 or repeats < 1:
        raise AutotuneError("--steps and --repeats must be at least 1")
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


def _block(runner: TrainRunner, steps: int, settle: int) -> tuple[float, list[float], int | None]:
    """Mean seconds per step over ``steps`` timed steps after ``settle`` untimed ones, losses, CUDA peak."""
    for _ in range(settle):
        runner.step()
    cuda = runner.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(runner.device)
    timings = [runner.step() for _ in range(steps)]
    peak = int(torch.cuda.max_memory_allocated(runner.device)) if cuda else None
    return statistics.fmean(t.total for t in timings), [t.loss for t in timings], peak


def _change_text(proposal: Suggestion) -> str:
    return ", ".join(f"{knob}={value}" for knob, value in proposal.change.items())


def _notes(log: list[ConfirmStep]) -> list[str]:
    notes = []
    if any(step.status == "not_confirmable" for step in log):
        notes.append("ZeRO, offload and DeepSpeed 16-bit weights are measured by `autotune tune`")
    if not log:
        notes.append("the policy proposed nothing for this model and machine")
    return notes
