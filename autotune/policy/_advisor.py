"""The advisor: apply the policy's rules in order to a profile's facts, each change stacked on the last."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from autotune.estimator import ModelFacts, facts_from_profile, fit_step_time, offload_seconds
from autotune.policy._actions import ACTIONS
from autotune.policy._fact_builder import FactBuilder
from autotune.policy._facts import Facts
from autotune.policy._loader import Policy, Rule, load_policy
from autotune.policy._records import Evidence, Predicted, Suggestion, SuggestRecord
from autotune.records import (
    DEFAULT_MARGIN,
    AutotuneError,
    Machine,
    Plan,
    ProfileRecord,
    format_bytes,
    fsdp2_equivalent,
    parse_bytes,
)


def suggest(
    profile: ProfileRecord,
    *,
    machine: Machine | None = None,
    device_memory: int | str | None = None,
    world_size: int = 1,
    nproc_per_node: int | None = None,
    inter_gbps: float | None = None,
    margin: float = DEFAULT_MARGIN,
    global_batch: int | None = None,
    policy_path: str | Path | None = None,
    start: Plan | None = None,
    skip_rules: Collection[str] = (),
    profile_path: str | None = None,
    more_profiles: Sequence[ProfileRecord] = (),
    framework: str | None = None,
    model: ModelFacts | None = None,
) -> SuggestRecord:
    """Apply the policy to a profile: every change that applies, in order, stacked.

    Args:
        profile: the measured baseline.
        machine: the target machine, budget and margin included (a budget not given is
            filled from the profile: :meth:`Machine.with_default_budget`). Without it, the
            next five arguments build one.
        device_memory: per-device budget in bytes or with a unit ("80GiB"; default: the
            profiled device's, if known).
        world_size: data-parallel devices in all.
        nproc_per_node: devices per node (default: all on one node).
        inter_gbps: inter-node link bandwidth in Gbit/s (``None``: unknown).
        margin: share of the budget kept free when deciding what fits.
        global_batch: the target global batch (samples per optimizer step).
        policy_path: a policy TOML file (default: the shipped ``autotune/policy/default.toml``).
        start: the plan to build on (default: the profiled plan); confirm passes what it kept.
        skip_rules: rule ids not to apply (confirm passes the rejected ones).
        profile_path: the profile's file name, for the record.
        more_profiles: profiles of the same model at another batch size (or with
            checkpointing switched) that the step-time model is fitted to; without one,
            no micro-batch is predicted faster than another.
        framework: the user's framework; ``torch`` or ``accelerate`` names the FSDP2
            alternative of every suggestion that turns a ZeRO stage.
        model: the profile's facts as the composer built them (:func:`autotune.compose.compose`),
            so the advice predicts each plan as every other road does; default: read from
            ``profile`` and ``more_profiles`` here.

    Returns:
        The suggestions in order, each with its stacked plan, evidence and prediction.
    """
    if global_batch is not None and global_batch < 1:
        raise AutotuneError(f"--global-batch: {global_batch} must be at least 1")
    if machine is None:
        machine = _machine(device_memory, world_size, nproc_per_node, inter_gbps, margin)
    machine = machine.with_default_budget(profile)
    policy = load_policy(policy_path)
    if model is None:
        model = facts_from_profile(profile)
        for other in more_profiles:
            model = fit_step_time(model, other)
    builder = FactBuilder(profile, model, machine, global_batch)
    plan = start or builder.baseline
    suggestions: list[Suggestion] = []
    for step in _steps(policy):
        facts = builder.facts(plan)
        for rule in step:
            if rule.id in skip_rules or not rule.applies(facts):
                continue
            made = _make(rule, facts, plan, builder)
            if made is not None:
                suggestions.append(made)
                plan = made.plan
    return SuggestRecord(
        profile=profile_path,
        policy=policy.path,
        baseline=builder.baseline,
        device_memory_bytes=machine.device_memory,
        budget_source=machine.budget_source,
        world_size=machine.world_size,
        nproc_per_node=machine.nproc_per_node,
        inter_gbps=machine.inter_gbps,
        margin=machine.margin,
        global_batch=global_batch,
        global_batch_kept=_global_batch_note(global_batch, plan) is None,
        suggestions=[_with_fsdp2(s, framework) for s in suggestions],
        final_plan=plan,
        final_predicted=_predict(builder, builder.facts(builder.baseline), builder.baseline, plan),
        notes=_notes(builder, plan),
        framework=framework,
    )


FSDP2_FRAMEWORKS = ("torch", "accelerate")
"""Frameworks whose users shard with PyTorch's own FSDP2 as readily as with DeepSpeed."""


def _with_fsdp2(suggestion: Suggestion, framework: str | None) -> Suggestion:
    """The suggestion with its FSDP2 alternative named, where the framework and change call for it."""
    if framework not in FSDP2_FRAMEWORKS or "zero_stage" not in suggestion.change:
        return suggestion
    alternative = fsdp2_equivalent(suggestion.plan)
    if alternative is None:
        return suggestion
    return suggestion.model_copy(update={"fsdp2_alternative": alternative.describe()})


def policy_plan(profile: ProfileRecord, **options: Any) -> Plan:
    """The plan the policy ends at (every suggestion stacked); tune tries it first.

    Takes the same keyword options as :func:`suggest`.
    """
    return suggest(profile, **options).final_plan


def _machine(
    device_memory: int | str | None,
    world_size: int,
    nproc_per_node: int | None,
    inter_gbps: float | None,
    margin: float,
) -> Machine:
    """The machine the keyword arguments describe (``world_size`` devices in all)."""
    if world_size < 1:
        raise AutotuneError(f"--world-size: {world_size} must be at least 1")
    per_node = nproc_per_node or world_size
    if per_node < 1 or world_size % per_node:
        raise AutotuneError(
            f"--gpus-per-node: {per_node} does not divide --world-size {world_size}"
        )
    if isinstance(device_memory, str):
        device_memory = parse_bytes(device_memory, "device_memory")
    return Machine(device_memory=device_memory, nproc_per_node=per_node,
                   nnodes=world_size // per_node, inter_gbps=inter_gbps, margin=margin)  # fmt: skip


def _steps(policy: Policy) -> list[list[Rule]]:
    """The rules grouped by order: a group sees the same facts."""
    groups: list[list[Rule]] = []
    for rule in policy.rules:
        if groups and groups[-1][0].order == rule.order:
            groups[-1].append(rule)
        else:
            groups.append([rule])
    return groups


def _make(rule: Rule, facts: Facts, plan: Plan, builder: FactBuilder) -> Suggestion | None:
    """The suggestion a rule makes on ``plan``, or ``None`` when it changes nothing."""
    wanted = rule.changes(facts)
    change = {knob: value for knob, value in wanted.items() if getattr(plan, knob) != value}
    if not change:
        return None
    try:
        after = plan.with_changes(**change)
    except ValueError as exc:
        raise AutotuneError(
            f"rule {rule.id!r}: field action: proposes an invalid plan {change}: {exc}"
        ) from None
    names = [clause.fact for clause in rule.clauses()] + list(ACTIONS[rule.action].uses)
    evidence = {
        name: Evidence(value=facts.value(name), source=facts.source(name)) for name in names
    }
    return Suggestion(
        rule=rule.id,
        change=change,
        plan=after,
        plan_text=after.describe(),
        evidence=evidence,
        predicted=_predict(builder, facts, plan, after),
        reason=rule.reason,
    )


def _predict(builder: FactBuilder, before: Facts, plan: Plan, after: Plan) -> Predicted:
    """Memory and step time of ``after`` relative to ``plan``, from the estimate."""
    est_before, est_after = builder.estimate(plan), builder.estimate(after)
    ratio: float | None = None
    time_source = est_after.time_source
    if after.dataloader_workers != plan.dataloader_workers:
        ratio, time_source = _loader_ratio(builder, plan, after), "formula"
    elif est_before.predicted_step_time_ratio and est_after.predicted_step_time_ratio is not None:
        ratio = est_after.predicted_step_time_ratio / est_before.predicted_step_time_ratio
        # A change of the samples per step is compared per sample: that is its speed.
        ratio *= plan.global_batch / after.global_batch
    peak_before = before.peak_bytes
    return Predicted(
        peak_bytes_before=peak_before,
        peak_bytes_after=est_after.memory.peak,
        fits_after=est_after.fits,
        step_time_ratio=ratio,
        step_seconds_after=est_after.predicted_step_seconds,
        step_seconds_interval_after=est_after.predicted_step_seconds_interval,
        samples_per_s_per_device_after=est_after.samples_per_s_per_device,
        memory_source=est_after.source,
        time_source=time_source,
        host_bytes_after=est_after.host_bytes_per_node,
        host_fits_after=est_after.host_fits,
        offload_bytes_per_step=est_after.offload_bytes_per_step,
        offload_seconds=offload_seconds(est_after.offload_bytes_per_step, builder.machine),
        host_optimizer_seconds=est_after.host_optimizer_seconds,
    )


def _loader_ratio(builder: FactBuilder, plan: Plan, after: Plan) -> float | None:
    """Step time with more workers over step time without: only the waiting goes away."""
    time = builder.profile.time
    before_share, _ = builder.input_share(plan)
    after_share, _ = builder.input_share(after)
    if before_share is None or after_share is None or time.step <= 0:
        return None
    compute = time.step * (1 - before_share)
    return (compute / (1 - after_share)) / time.step if after_share < 1 else None


def _notes(builder: FactBuilder, plan: Plan) -> list[str]:
    notes = []
    machine = builder.machine
    if machine.device_memory is None:
        notes.append(
            "no device memory budget (--device-memory): fits is unknown, rules that test it stay silent"
        )
    elif machine.budget_source == "available_ram":
        notes.append(f"budget: {format_bytes(machine.device_memory)}, this machine's available "
                     "memory (psutil), since no --device-memory was given for this CPU profile")  # fmt: skip
    changed = _global_batch_note(builder.global_batch, plan)
    if changed:
        notes.append(changed)
    notes.extend(_unfit_note(builder, plan))
    notes.extend(_slower_note(builder, plan))
    notes.extend(f"not used as evidence: the profile's {figure}, {why}"
                 for figure, why in builder.flags.items())  # fmt: skip
    if plan.uses_deepspeed:
        notes.append("the final plan needs DeepSpeed: `autotune config` writes its config")
    return notes


def _global_batch_note(target: int | None, plan: Plan) -> str | None:
    """Why the final plan's global batch is not the target (``None``: it is, or no target)."""
    if target is None or plan.global_batch == target:
        return None
    world = plan.world_size
    gives = (f"the final plan gives {plan.global_batch} (micro-batch {plan.micro_batch} x "
             f"accumulation {plan.grad_accum} x {world} rank{'s' if world > 1 else ''})")  # fmt: skip
    if target % world:
        why = (f"{target} samples do not split evenly over {world} ranks; choose a global "
               f"batch that is a multiple of {world}")  # fmt: skip
    else:
        why = ("no rule of the policy that ran keeps it (is keep_global_batch disabled or "
               "rejected?)")  # fmt: skip
    return f"global batch not kept: target {target}, {gives}: {why}"


def _unfit_note(builder: FactBuilder, plan: Plan) -> list[str]:
    """That the final plan is predicted not to fit, where it is."""
    facts, usable = builder.facts(plan), builder.machine.usable
    if facts.fits is not False or facts.peak_bytes is None or usable is None:
        return []
    return [f"the final plan is predicted not to fit: peak {format_bytes(facts.peak_bytes)} over "
            f"the usable {format_bytes(usable)}; no rule of the policy reaches the budget"]  # fmt: skip


def _slower_note(builder: FactBuilder, plan: Plan) -> list[str]:
    """Why the final plan is predicted slower than the baseline (per sample), when it is."""
    baseline = builder.baseline
    before = builder.estimate(baseline).predicted_step_time_ratio
    after = builder.estimate(plan).predicted_step_time_ratio
    if not before or after is None:
        return []
    ratio = (after / plan.global_batch) / (before / baseline.global_batch)
    if ratio <= 1.0:
        return []
    final, first = builder.facts(plan), builder.facts(baseline)
    if final.fits is False and final.peak_bytes is not None and first.peak_bytes is not None:
        why = (f"its changes take the peak from {format_bytes(first.peak_bytes)} to "
               f"{format_bytes(final.peak_bytes)}, still over the budget")  # fmt: skip
    elif first.fits is False:
        why = "it exists to fit: the baseline is predicted not to"
    else:
        why = "the baseline is predicted to fit, so a change here costs speed"
    return [f"the final plan is predicted x{ratio:.2f} the baseline's time per sample; {why}"]
