"""The confirm loop: ask the policy for one change, measure it against what was kept, decide.

The measurement is injected (``autotune.runtime.ab`` runs real interleaved steps;
tests pass a fake), so the loop itself is pure bookkeeping over records.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from autotune.confirm._records import ConfirmRecord, ConfirmStep, Measured
from autotune.confirm._verdict import decide
from autotune.policy import Suggestion, SuggestRecord, suggest
from autotune.records import AUTOCAST_PLAN_PRECISION, Machine, NotApplicable, Plan, ProfileRecord

Progress = Callable[[str], None]
Advise = Callable[[Plan | None, Collection[str]], SuggestRecord]
"""``(start, rules to skip) -> the policy's advice from start`` (None: the profiled plan)."""
Measure = Callable[[Plan, Plan], Mapping[str, Any]]
"""``(before, after) -> {ratios, before_step_s, after_step_s, loss_before, loss_after,
peak_bytes_before, peak_bytes_after}`` from interleaved A/B repeats; raises
:class:`~autotune.records.NotApplicable` for a change the model file cannot take."""

IN_PROCESS_KNOBS = frozenset(
    {
        "precision",
        "checkpoint_blocks",
        "micro_batch",
        "grad_accum",
        "dataloader_workers",
        "pin_memory",
        "attention",
        "compile",
    }
)
"""Knobs a plain torch training loop can switch in-process; the rest need DeepSpeed engines."""
IN_PROCESS_PRECISIONS = frozenset(AUTOCAST_PLAN_PRECISION.values())


def confirm_changes(
    profile: ProfileRecord,
    measure: Measure,
    *,
    model_file: str,
    device: str,
    repeats: int,
    steps: int,
    loss_tolerance: float = 0.05,
    max_changes: int = 8,
    progress: Progress | None = None,
    machine: Machine | None = None,
    global_batch: int | None = None,
    policy_path: str | Path | None = None,
    advise: Advise | None = None,
) -> ConfirmRecord:
    """Measure each proposed change against the plan kept so far; keep it only when it helps.

    Args:
        profile: the measured baseline the policy reads.
        measure: runs ``before`` and ``after`` interleaved and returns their figures.
        model_file: the user's model file, for the record.
        device: where the steps run, for the record.
        repeats: interleaved A/B repeats per change (for the record).
        steps: timed steps per arm in each repeat (for the record).
        loss_tolerance: largest relative difference of the mean loss accepted.
        max_changes: most changes proposed in one session.
        progress: called with one line per event (the CLI prints them to stderr).
        machine: the target machine and its budget (default: the profiled device's
            memory, or this CPU's available memory).
        global_batch: the target global batch, kept with accumulation.
        policy_path: a policy TOML file (default: the default policy).
        advise: the policy's advice from a plan, skipping some rules, as the composer gives it
            (:meth:`autotune.compose.Composition.advice`); default: :func:`suggest` on
            ``profile``, ``machine``, ``global_batch`` and ``policy_path``.

    Returns:
        The session log: every change proposed, predicted, measured, kept or rejected.
    """
    say = progress or (lambda line: None)
    kept: Plan | None = None
    skip: set[str] = set()
    log: list[ConfirmStep] = []
    baseline: Plan | None = None
    for _ in range(max_changes):
        record = (
            advise(kept, skip)
            if advise is not None
            else suggest(profile, machine=machine, global_batch=global_batch,
                         policy_path=policy_path, start=kept, skip_rules=skip)
        )  # fmt: skip
        baseline = baseline or record.baseline
        if not record.suggestions:
            break
        proposal = record.suggestions[0]
        current = kept or record.baseline
        say(f"{proposal.rule}: trying {_change_text(proposal)} on {current.describe()}")
        step = _try(measure, current, proposal, repeats, steps, loss_tolerance)
        say(f"{proposal.rule}: {step.status}: {step.why}")
        log.append(step)
        if step.status == "kept":
            kept = proposal.plan
        else:
            skip.add(proposal.rule)
    start = baseline or Plan(micro_batch=profile.config.batch_size)
    return ConfirmRecord(
        model_file=model_file,
        device=device,
        baseline=start,
        final_plan=kept or start,
        loss_tolerance=loss_tolerance,
        steps=log,
        notes=_notes(log),
    )


def _try(
    measure: Measure,
    current: Plan,
    proposal: Suggestion,
    repeats: int,
    steps: int,
    tolerance: float,
) -> ConfirmStep:
    """Measure one proposal and decide; changes that need DeepSpeed are only recorded."""
    common = {"rule": proposal.rule, "change": proposal.change, "plan": proposal.plan}
    outside = sorted(set(proposal.change) - IN_PROCESS_KNOBS)
    if outside or proposal.plan.precision not in IN_PROCESS_PRECISIONS:
        knobs = ", ".join(outside) or f"precision={proposal.plan.precision}"
        why = f"{knobs} needs DeepSpeed engines: cannot be confirmed in-process (`autotune tune` measures it)"
        return ConfirmStep(
            **common, predicted=proposal.predicted, status="not_confirmable", why=why
        )
    try:
        measured = dict(measure(current, proposal.plan))
    except NotApplicable as exc:
        # Never an A/B of two identical plans: nothing changed, so nothing is measured.
        why = f"not applied automatically: {exc}"
        return ConfirmStep(**common, predicted=proposal.predicted, status="not_applicable", why=why)
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


def _change_text(proposal: Suggestion) -> str:
    return ", ".join(f"{knob}={value}" for knob, value in proposal.change.items())


def _notes(log: list[ConfirmStep]) -> list[str]:
    notes = []
    if any(step.status == "not_confirmable" for step in log):
        notes.append("ZeRO, offload and DeepSpeed 16-bit weights are measured by `autotune tune`")
    if any(step.status == "not_applicable" for step in log):
        notes.append("a change marked not_applicable needs the code change in its why: "
                     "autotune could not apply it to this model file, so it measured nothing")  # fmt: skip
    if not log:
        notes.append("the policy proposed nothing for this model and machine")
    return notes
