"""Script trials from Python: ``autotune tune -- COMMAND`` wires the user's own launch command,
the start-up hook (runtime) and the search, composed as a model file's tune is.

Runtime modules are imported inside the functions, so importing this module imports no torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune import compose
from autotune.api._common import default_guard
from autotune.emit import code_changes_for
from autotune.records import (
    AutotuneError,
    Machine,
    Plan,
    ProfileOptions,
    ProfileRecord,
    TuneOptions,
    read_record,
)
from autotune.search import (
    Progress,
    ScriptProbe,
    ScriptRunner,
    TrialRunner,
    TrialSettings,
    TuneRecord,
    check_command,
    command_ranks,
    parse_arg_map,
    trial_settings,
    tune,
)

NO_PROFILE = (
    "the script's model could not be profiled: the estimate pruned no plan and the policy's "
    "rules were not applied"
)
# Knobs only the Trainer takes from outside the script (its loader and compile arguments).
_TRAINER_ONLY = {"dataloader_workers": 0, "pin_memory": False, "compile": False}


def check_script(
    command: Sequence[str], options: TuneOptions, machine: Machine,
    arg_map: Sequence[str] | Mapping[str, str] = (),
) -> dict[str, str]:  # fmt: skip
    """Every check of ``autotune tune -- COMMAND`` that needs no launch.

    Returns:
        The flag mapping as a dict.

    Raises:
        AutotuneError: one line naming the flag or the command's part at fault.
    """
    if machine.nnodes != 1:
        raise AutotuneError(f"--nnodes {machine.nnodes}: a script's trials run on this node only")
    if "fsdp2" in (options.engines or ()):
        raise AutotuneError(
            "--engines fsdp2: a script's trials inject DeepSpeed only (the FSDP2 plugin is not "
            "injected into Trainer or Accelerate scripts); tune a model file for FSDP2"
        )
    options.check_machine(machine)
    check_command(command, machine.nproc_per_node)
    return dict(arg_map) if isinstance(arg_map, Mapping) else parse_arg_map(arg_map)


def _injectable(policy: Plan, probe: ScriptProbe | None) -> tuple[Plan, list[str]]:
    """The policy's plan less what the script's entry point cannot take from outside: the
    attention kernel (the script builds its model) and, but for the Trainer, loader and compile."""
    drop: dict[str, object] = {"attention": "default"}
    if probe is None or probe.entry != "trainer":
        drop |= _TRAINER_ONLY
    changed = [k for k, v in drop.items() if getattr(policy, k) != v]
    if not changed:
        return policy, []
    entry = probe.entry if probe is not None else None
    note = (f"the policy's {', '.join(changed)} not applied (trials ran without): only the "
            f"script's own code sets them (its entry point: {entry or 'unknown'})")  # fmt: skip
    return policy.with_changes(**{k: drop[k] for k in changed}), [note]


def tune_script(
    command: Sequence[str],
    *,
    options: TuneOptions,
    machine: Machine,
    arg_map: Sequence[str] | Mapping[str, str] = (),
    runner: TrialRunner | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> TuneRecord:
    """``autotune tune -- COMMAND``: search plans with trials of the user's own training script.

    Each trial runs ``command`` (``python train.py ...``, ``torchrun ...``, ``accelerate
    launch ...``, ``deepspeed ...``) with a start-up hook that injects the plan into the
    entry point the script calls (HF ``Trainer``, ``deepspeed.initialize``, ``Accelerator``),
    measures the script's own steps, and stops the run after them. A first launch probes the
    model (its block stack for the checkpointing knob, its size for ZeRO's buckets) and checks
    that the micro-batch reaches the script's loader.

    Args:
        command: the user's launch command, unchanged.
        options: what the run is asked (global batch, trials, steps, storage, ...).
        machine: the device, its budget and the ranks per trial (one node); the command's
            own rank count, where it names one, must agree.
        arg_map: ``KEY=--flag`` items (or a dict): the script flag that takes a DeepSpeed
            config key's value (``train_micro_batch_size_per_gpu=--batch-size``); how a
            DeepSpeed or Accelerate script's loader gets the micro-batch.
        runner: launches trials (default: a :class:`ScriptRunner` of ``command``; one that
            is not a ScriptRunner skips the probe).
        progress: called after each trial.

    Raises:
        AutotuneError: bad options, or a first launch that fails (its line says why).
    """
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.runtime.trial.script import HOOK_DIR, PARAMETERS_ENV, trial_device

    mapping = check_script(command, options, machine, arg_map)
    label = shlex.join(command)
    if options.study_name is None:
        script = next((t for t in command if t.endswith(".py")), command[-1])
        stem = f"{Path(script).stem}-g{options.global_batch}-n{machine.nproc_per_node}"
        options = replace(options, study_name=stem)
    options = replace(options, engines=options.searched_engines(script=True))
    machine = replace(machine, device=trial_device(machine.device))
    settings = trial_settings(label, options, machine, default_guard(machine.nproc_per_node))
    if runner is None:
        runner = ScriptRunner(command, hook_dir=HOOK_DIR, arg_map=mapping,
                              entry_points=ENTRY_POINTS)  # fmt: skip
    saved = (
        read_record(options.profile_path, ProfileRecord, "profile")
        if options.profile_path
        else None
    )
    probe = None
    if isinstance(runner, ScriptRunner):
        first = options.baseline or Plan(
            micro_batch=options.global_batch // machine.nproc_per_node,
            nproc_per_node=machine.nproc_per_node,
        )
        probe = runner.probe(first, settings, profile=saved is None)
        if probe.parameters is not None:
            runner.env[PARAMETERS_ENV] = str(probe.parameters)
    blocks = probe.blocks if probe is not None else 0
    stack = probe.block_stack if probe is not None else None
    record = saved or (probe.profile if probe is not None else None)
    policy, predict, notes = None, None, [NO_PROFILE]
    if record is not None:
        composition = compose.compose(record, machine=machine, global_batch=options.global_batch,
                                      policy_path=options.policy_path)  # fmt: skip
        machine = composition.machine
        settings = trial_settings(label, options, machine, default_guard(machine.nproc_per_node))
        assert composition.policy is not None
        policy, notes = _injectable(composition.policy, probe)
        predict = composition.prediction

    def changes(plan: Plan) -> list[Any]:
        return code_changes_for(plan, block_stack_path=stack, num_blocks=blocks or None,
                                model_class=record.model.class_name if record else None)  # fmt: skip

    tuned = tune(label, options=options, machine=machine, settings=settings, runner=runner,
                 blocks=blocks, policy=policy, predict=predict, code_changes=changes,
                 progress=progress)  # fmt: skip
    tuned = tuned.model_copy(update={"notes": [*notes, *tuned.notes]})
    if tuned.recommendation is None or probe is None:
        return tuned
    rec = tuned.recommendation.model_copy(update={"parameters": probe.parameters})
    return tuned.model_copy(update={"recommendation": rec})


def profile_script(
    command: Sequence[str], *, batch_size: int, steps: int = ProfileOptions.steps,
    warmup: int = ProfileOptions.warmup,
    device: str = ProfileOptions.device, arg_map: Sequence[str] | Mapping[str, str] = (),
    timeout_s: float = 600.0,
) -> ProfileRecord:  # fmt: skip
    """``autotune profile -- COMMAND``: the profiler's record of the model the script builds, fed
    its own first batch (``batch_size`` samples: the script's loader must give that many, through
    ``arg_map`` or its own flags), measured in the script's process on rank 0.

    Raises:
        AutotuneError: a bad command, a launch that fails, or a model that could not be profiled.
    """
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.runtime.trial.script import HOOK_DIR, trial_device

    nproc = command_ranks(command) or 1
    check_command(command, nproc)
    mapping = dict(arg_map) if isinstance(arg_map, Mapping) else parse_arg_map(arg_map)
    label = shlex.join(command)
    settings = TrialSettings(model_file=label, steps=steps, warmup=warmup, device=trial_device(device),
                             timeout_s=timeout_s, memory_guard=default_guard(nproc))  # fmt: skip
    runner = ScriptRunner(command, hook_dir=HOOK_DIR, arg_map=mapping, entry_points=ENTRY_POINTS)
    probe = runner.probe(Plan(micro_batch=batch_size, nproc_per_node=nproc), settings, profile=True)
    if probe.profile is None:
        raise AutotuneError(f"--: the script's model could not be profiled: {probe.profile_error}")
    return probe.profile
