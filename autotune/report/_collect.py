"""From the records (profile, tune, recommendation) to the report's rows: pure, no plotting."""

from __future__ import annotations

from autotune.estimator import MFU_FIGURE, flagged_figures
from autotune.records import (
    MeasuredPlan,
    Plan,
    ProfileRecord,
    Recommendation,
    format_bytes,
    format_count,
)
from autotune.report._data import MemoryBar, Outcome, StepSplit, TrialPoint
from autotune.search import TrialRecord

MAX_BLOCK_ROWS = 64
"""More modules than this make the per-block figure unreadable; the rest are counted in a note."""


def profile_summary(profile: ProfileRecord) -> list[tuple[str, str]]:
    """Key figures of a profile as (label, value with unit and source) rows."""
    model, env, time, thr = profile.model, profile.environment, profile.time, profile.throughput
    params = (
        f"{format_count(model.parameters)} ({format_count(model.trainable_parameters)} trainable)"
    )
    tokens = f", {thr.tokens_per_s:,.0f} tokens/s" if thr.tokens_per_s is not None else ""
    rows = [
        ("model", f"{model.class_name} from {profile.provenance.model_file}"),
        ("parameters", params),
        (
            "device",
            f"{env.device_name} ({env.device_type}), memory {format_bytes(env.device_memory_bytes)}",
        ),
        ("profiled with", _config_text(profile)),
        (
            "peak memory",
            f"{format_bytes(profile.memory.peak)} (measured, {profile.memory.peak_source})",
        ),
        (
            "step time",
            f"{time.step * 1e3:.2f} ms median over {time.steps_measured} steps (measured)",
        ),
        ("throughput", f"{thr.samples_per_s:,.2f} samples/s{tokens} (measured)"),
        ("MFU", _mfu_text(profile)),
    ]
    return rows


def _config_text(profile: ProfileRecord) -> str:
    cfg = profile.config
    ckpt = "checkpointing on" if cfg.checkpointing else "no checkpointing"
    return (
        f"batch {cfg.batch_size}, {cfg.precision}, {ckpt}, {cfg.warmup} warm-up + {cfg.steps} steps"
    )


def _mfu_text(profile: ProfileRecord) -> str:
    compute = profile.compute
    if compute.mfu is None:
        why = profile.environment.unavailable.get("mfu") or compute.note or "peak FLOPs unknown"
        return f"not measured ({why})"
    flag = flagged_figures(profile).get(MFU_FIGURE)
    if flag:  # an impossible figure is shown for the record, never as a fact
        return f"{compute.mfu:.1%} (flagged, {flag})"
    return f"{compute.mfu:.1%} (measured FLOP rate / {compute.peak_source} peak)"


def profile_bar(profile: ProfileRecord, label: str, plan: Plan | None) -> MemoryBar:
    """The profiled plan's bar: what was live at its measured peak, by category.

    ``other`` gathers buffers, autocast's weight copies and the temporaries live at the
    peak, and whatever of the peak the profiler did not attribute (none in current records).
    """
    mem, at = profile.memory, profile.memory.at_peak
    parts = {
        "parameters": at.parameters,
        "gradients": at.gradients,
        "optimizer_states": at.optimizer_states,
        "activations": at.activations,
        "other": at.buffers + at.autocast_weight_copies + at.temporaries,
    }
    parts["other"] += max(mem.peak - sum(parts.values()), 0)
    return MemoryBar(
        label,
        parts,
        f"measured ({mem.peak_source})",
        measured_peak=mem.peak,
        plan=plan.describe() if plan is not None else None,
        ranks=plan.world_size if plan is not None else None,
    )


def block_rows(profile: ProfileRecord) -> tuple[list[tuple[str, int]], str | None]:
    """Activation bytes per module in model order, capped, with a note when some were left out."""
    rows = [(item.module, item.bytes) for item in profile.memory.activations_by_module]
    if len(rows) <= MAX_BLOCK_ROWS:
        return rows, None
    note = f"activations per block: showing the first {MAX_BLOCK_ROWS} of {len(rows)} modules"
    return rows[:MAX_BLOCK_ROWS], note


def step_split(profile: ProfileRecord) -> StepSplit:
    """The profile's median step split into input wait, forward, backward and optimizer."""
    t = profile.time
    phases = {
        "dataloader": t.dataloader,
        "forward": t.forward,
        "backward": t.backward,
        "optimizer": t.optimizer,
    }
    return StepSplit(t.step, phases)


def trial_points(trials: list[TrialRecord]) -> list[TrialPoint]:
    """The finished trials of a tune run or study; running or waiting trials are left out."""
    return [point for trial in trials if (point := _trial_point(trial)) is not None]


def _trial_point(trial: TrialRecord) -> TrialPoint | None:
    outcome: Outcome
    if trial.outcome is not None:
        # A trial that ran out of memory may also be pruned in the study: its outcome says more.
        outcome = trial.outcome
    elif trial.state == "pruned":
        outcome = "pruned"
    else:
        return None
    peak = trial.peak_memory_bytes
    note = trial.reason or ""
    if peak is None and trial.predicted_peak_bytes is not None:
        # A pruned plan never ran: place it at its predicted peak and say so.
        peak = trial.predicted_peak_bytes
        note = f"{note}; peak predicted ({trial.prediction_source or 'formula'})".lstrip("; ")
    return TrialPoint(trial.number, trial.plan.describe(), outcome, trial.samples_per_s, peak, note)


def recommendation_rows(rec: Recommendation) -> list[tuple[str, str]]:
    """The recommendation as (label, value) rows: plan, measured evidence, code changes."""
    rows = [("plan", rec.plan.describe()), ("decided by", rec.source)]
    if rec.speedup is not None:
        interval = rec.speedup_interval
        extra = f" (range over repeats {interval[0]:.2f}–{interval[1]:.2f}×)" if interval else ""
        rows.append(("speed-up over baseline", f"{rec.speedup:.2f}×{extra} (measured)"))
    if rec.best is not None:
        rows.append(("best (measured)", _measured_text(rec.best)))
    if rec.baseline is not None:
        rows.append(("baseline (measured)", _measured_text(rec.baseline)))
    rows += [("code change", change.what) for change in rec.code_changes]
    rows += [("note", note) for note in rec.notes]
    return rows


def _measured_text(measured: MeasuredPlan) -> str:
    text = f"{measured.plan.describe()}: {measured.samples_per_s:,.2f} samples/s"
    if measured.samples_per_s_interval is not None:
        low, high = measured.samples_per_s_interval
        text += f" ({low:,.2f}–{high:,.2f} over {measured.repeats} repeats)"
    if measured.peak_memory_bytes is not None:
        text += f", peak {format_bytes(measured.peak_memory_bytes)}"
    return text
