"""The composer for script trials: ``autotune tune -- COMMAND`` wires the user's own launch
command, the start-up hook (runtime) and the search, as :mod:`autotune.api` does for model files.

Runtime modules are imported inside the functions, so importing this module imports no torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.emit import code_changes_for
from autotune.records import AutotuneError, Machine, Plan, TuneOptions
from autotune.search import (
    Progress,
    ScriptRunner,
    TrialRunner,
    TuneRecord,
    check_command,
    parse_arg_map,
    trial_settings,
    tune,
)

GUARD_SHARE = 0.5
"""Share of the machine's available RAM all ranks of a trial may use together."""
NO_PROFILE = (
    "a script's trials have no profile: the estimate pruned no plan and the policy's rules were "
    "not applied (tune a model file of the same model for those)"
)


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
    if machine.nodes != 1:
        raise AutotuneError(f"--nnodes {machine.nodes}: a script's trials run on this node only")
    if options.profile_path or options.policy_path:
        flag = "--profile" if options.profile_path else "--policy"
        raise AutotuneError(f"{flag}: not used with -- COMMAND (a script's trials have no profile)")
    options.check_machine(machine)
    check_command(command, machine.gpus_per_node)
    return dict(arg_map) if isinstance(arg_map, Mapping) else parse_arg_map(arg_map)


def _guard(nproc: int) -> int:
    import psutil

    return int(psutil.virtual_memory().available * GUARD_SHARE / nproc)


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
        stem = f"{Path(script).stem}-g{options.global_batch}-n{machine.gpus_per_node}"
        options = replace(options, study_name=stem)
    machine = replace(machine, device=trial_device(machine.device))
    settings = trial_settings(label, options, machine, _guard(machine.gpus_per_node))
    if runner is None:
        runner = ScriptRunner(command, hook_dir=HOOK_DIR, arg_map=mapping,
                              entry_points=ENTRY_POINTS)  # fmt: skip
    probe = None
    if isinstance(runner, ScriptRunner):
        first = options.baseline or Plan(
            micro_batch=options.global_batch // machine.gpus_per_node,
            gpus_per_node=machine.gpus_per_node,
        )
        probe = runner.probe(first, settings)
        if probe.parameters is not None:
            runner.env[PARAMETERS_ENV] = str(probe.parameters)
    blocks = probe.blocks if probe is not None else 0
    stack = probe.block_stack if probe is not None else None

    def changes(plan: Plan) -> list[Any]:
        return code_changes_for(plan, block_stack_path=stack, num_blocks=blocks or None)

    tuned = tune(label, options=options, machine=machine, settings=settings, runner=runner,
                 blocks=blocks, code_changes=changes, progress=progress)  # fmt: skip
    tuned = tuned.model_copy(update={"notes": [NO_PROFILE, *tuned.notes]})
    if tuned.recommendation is None or probe is None:
        return tuned
    rec = tuned.recommendation.model_copy(update={"parameters": probe.parameters})
    return tuned.model_copy(update={"recommendation": rec})
