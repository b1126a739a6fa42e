"""The one answer for a model on a machine: its facts, the budget, the policy's plan, and one
prediction per plan that every road (estimate, suggest, tune, recommend, confirm) reads.

Pure: no torch. The measurements it composes come from ``autotune.compose._sources``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from autotune.emit import code_changes_for
from autotune.estimator import (
    ActivationSpec,
    ModelFacts,
    PlanEstimate,
    estimate_plan,
    facts_from_profile,
    fit_step_time,
    with_activations,
)
from autotune.policy import SuggestRecord, suggest
from autotune.records import (
    CodeChange,
    LinkMeasure,
    Machine,
    Plan,
    ProfileRecord,
    TimedSteps,
    format_bytes,
)
from autotune.search import Prediction


@dataclass(frozen=True, kw_only=True)
class Composition:
    """A model's facts on one machine, and everything derived from them once.

    Build it with :func:`compose` (a profile) or :func:`compose_facts` (a trace of a model
    file, no profile); every figure a user reads of a plan comes from :meth:`estimate`.
    """

    facts: ModelFacts
    """What the estimate knows of the model: a profile's measured figures (with the ones it
    traced), or a trace's."""
    machine: Machine
    """The target machine, its budget resolved (given, the profiled GPU's, or this CPU's
    available memory)."""
    profile: ProfileRecord | None = None
    """The measured baseline; ``None`` on the model-file road (nothing run)."""
    global_batch: int | None = None
    """Samples per optimizer step the policy keeps; ``None``: the profiled plan's."""
    policy_path: str | Path | None = None
    """The policy file; ``None``: the default policy."""
    framework: str | None = None
    """The user's framework (names FSDP2 alternatives in the advice)."""
    block_stack: str | None = None
    """Dotted path of the model's repeated blocks, for the code changes."""
    model_class: str | None = None
    """The model's class name, for the code changes."""
    _estimates: dict[Plan, PlanEstimate] = field(default_factory=dict, repr=False, compare=False)

    def estimate(self, plan: Plan) -> PlanEstimate:
        """The plan's predicted memory, fit, time and communication (the one figure per plan)."""
        if plan not in self._estimates:
            self._estimates[plan] = estimate_plan(self.facts, plan, machine=self.machine)
        return self._estimates[plan]

    def on_link(self, link: LinkMeasure) -> Composition:
        """The same composition with communication timed on a measured link (a trial's sweep);
        a link the user gave (``--intra-gbps`` / ``--inter-gbps``) still wins in the estimate."""
        machine = dataclasses.replace(self.machine, link=link)
        return dataclasses.replace(self, machine=machine, _estimates={})

    def prediction(self, plan: Plan) -> Prediction:
        """The search's view of :meth:`estimate`: fits, peak, and why it does not fit."""
        est = self.estimate(plan)
        peak, ratio = est.memory.peak, est.predicted_step_time_ratio
        moment = est.memory.peak_composition.split(" ", 1)[0] or None
        if est.fits is not False:
            return Prediction(True, peak, est.source, step_time_ratio=ratio, peak_moment=moment)
        machine = self.machine
        if machine.fits(peak) is False and machine.usable is not None:
            reason = (f"peak {format_bytes(peak)} > {format_bytes(machine.usable)} usable "
                      f"({format_bytes(machine.device_memory)} less the {machine.margin:.0%} "
                      f"margin; {est.source})")  # fmt: skip
        else:  # the device holds it; the offloaded states do not fit the host
            reason = (f"offloaded states take {format_bytes(est.host_bytes_per_node)} of host "
                      f"RAM per node > {format_bytes(machine.host_memory)}")  # fmt: skip
        return Prediction(False, peak, est.source, reason, step_time_ratio=ratio,
                          peak_moment=moment)  # fmt: skip

    def advice(
        self, *, start: Plan | None = None, skip_rules: Collection[str] = (),
        profile_path: str | None = None,
    ) -> SuggestRecord:  # fmt: skip
        """The policy's ordered changes from ``start`` (default: the profiled plan).

        Raises:
            ValueError: on the model-file road, which has no measured baseline to advise on.
        """
        if self.profile is None:
            raise ValueError("advice needs a profile (a measured baseline)")
        return suggest(
            self.profile, machine=self.machine, global_batch=self.global_batch,
            policy_path=self.policy_path, start=start, skip_rules=skip_rules,
            profile_path=profile_path, framework=self.framework, model=self.facts,
        )  # fmt: skip

    @cached_property
    def policy(self) -> Plan | None:
        """The plan the policy ends at (tune tries it first); ``None`` without a profile."""
        return None if self.profile is None else self.advice().final_plan

    def code_changes(self, plan: Plan) -> list[CodeChange]:
        """What ``plan`` needs beyond its DeepSpeed config, for this model's block stack."""
        return code_changes_for(
            plan, block_stack_path=self.block_stack, num_blocks=self.facts.num_layers or None,
            model_class=self.model_class,
        )  # fmt: skip


def compose(
    profile: ProfileRecord,
    *,
    machine: Machine,
    global_batch: int | None = None,
    more_profiles: Sequence[ProfileRecord | TimedSteps] = (),
    traced: dict[str, ActivationSpec] | None = None,
    policy_path: str | Path | None = None,
    framework: str | None = None,
) -> Composition:
    """The composition of a measured profile: its facts (the figures it traced included), the
    step time refined by ``more_profiles`` (another batch size, or checkpointing switched), and
    the budget filled in where none was given (:meth:`Machine.with_default_budget`).

    Args:
        traced: figures for precisions neither measured nor traced by the profile (an older
            record), from a trace of its unchanged model file.

    Raises:
        ValueError: a second profile that differs in more than one knob
            (:func:`fit_step_time`).
    """
    facts = with_activations(facts_from_profile(profile), traced or {})
    for other in more_profiles:
        facts = fit_step_time(facts, other)
    stack = profile.model.block_stack
    return Composition(
        facts=facts, machine=machine.with_default_budget(profile), profile=profile,
        global_batch=global_batch, policy_path=policy_path, framework=framework,
        block_stack=stack.path if stack else None, model_class=profile.model.class_name,
    )  # fmt: skip


def compose_facts(facts: ModelFacts, *, machine: Machine) -> Composition:
    """The composition of traced facts (the model-file road: nothing measured, no policy)."""
    return Composition(facts=facts, machine=machine, block_stack=facts.block_stack,
                       model_class=facts.name)  # fmt: skip
