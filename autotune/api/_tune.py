"""``tune`` from Python: a model file's (or a Hugging Face entry's) search over real trials,
composed once (:mod:`autotune.compose`), and the agent that serves trials on other nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import compose
from autotune.api._common import check_model_path, default_guard, tune_records
from autotune.compose import Composition
from autotune.policy import load_policy
from autotune.records import (
    AutotuneError,
    Machine,
    Plan,
    ProfileRecord,
    TuneOptions,
    read_record,
)
from autotune.search import (
    AgentRunner,
    PoolRunner,
    Progress,
    TrialRunner,
    TuneRecord,
    check_identity,
    open_study,
    parse_endpoint,
    serve,
    shared_profiles,
    trial_settings,
    tune,
)


def check_tune(options: TuneOptions, machine: Machine, model_path: str | None = None, *,
               launches: bool = True) -> None:  # fmt: skip
    """Every check of a tune run that needs no work: the model path, the options against the
    machine, the rendezvous endpoint (when this run ``launches`` the trials, not a runner
    given) and the policy file. One line each.

    Raises:
        AutotuneError: one line naming the model file or the flag.
    """
    check_model_path(model_path)
    options.check_machine(machine)
    if launches and machine.nnodes > 1 and options.rdzv_endpoint is None:
        raise AutotuneError(
            f"--nnodes {machine.nnodes}: give --rdzv-endpoint HOST:PORT on one of the nodes"
        )
    if launches and machine.nnodes > 1 and options.rdzv_endpoint:
        parse_endpoint(options.rdzv_endpoint)
    load_policy(options.policy_path)


def tune_model(
    model_path: str | None = None,
    *,
    options: TuneOptions | None = None,
    machine: Machine | None = None,
    runner: TrialRunner | None = None,
    progress: Callable[[Progress], None] | None = None,
    notice: Callable[[str], None] | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
    **fields: Any,
) -> TuneRecord:
    """Everything ``autotune tune`` does before and around :func:`autotune.search.tune`.

    Reads or takes two short profiles (two batch sizes, so the step-time model can rank
    micro-batches), resolves the machine's budget once (given, else the profiled GPU's,
    else this CPU's available memory) and hands it whole to the policy, the estimate and
    the search, which runs real trials: by default in a :class:`PoolRunner`, so start-up
    is paid once per rank count.

    Args:
        model_path: the model file (or ``hf_config``/``hf_model`` with ``seq_len``).
        options: what the run is asked (:class:`TuneOptions`); or give its fields as keywords.
        machine: the target machine (:class:`Machine`); or give its fields as keywords
            (``nproc`` for ``nproc_per_node``).
        runner: launches trials (default: a pooled runner here; over several nodes, the
            agents through the study).
        progress: called after each trial.
        notice: called with a line when the model has been profiled and the trial workers
            start: what the wait before the first trial is.
        hf_config: a transformers config instead of a model file (random init).
        hf_model: weights to load with ``from_pretrained`` instead of a model file.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        task: the head to build with ``hf_config``/``hf_model`` (default: the config's
            ``architectures``; :func:`autotune.runtime.hf.model_source`).
        **fields: fields of :class:`TuneOptions` and :class:`Machine`, when those are not given.

    Example:
        ``tune_model("model.py", global_batch=64, nproc_per_node=2, device_memory="2GiB")``
    """
    from autotune.runtime.hf import model_source

    began = time.monotonic()
    options, machine = tune_records(options, machine, fields)
    check_tune(options, machine, model_path, launches=runner is None)
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len,
                      task=task) as src:  # fmt: skip
        if options.study_name is None:
            name = f"{src.stem}-g{options.global_batch}-n{machine.nproc_per_node}"
            options = dataclasses.replace(options, study_name=name)
        tuned = _tune_file(str(src.path), src.label, options, machine, runner, progress, notice)
    if tuned.wall_time is None:
        return tuned
    # The whole call: a model resolved or downloaded counts as ``other``.
    wall = tuned.wall_time.with_phases(total_s=time.monotonic() - began)
    return tuned.model_copy(update={"wall_time": wall})


def _tune_file(
    model_path: str,
    label: str,
    options: TuneOptions,
    machine: Machine,
    runner: TrialRunner | None,
    progress: Callable[[Progress], None] | None,
    notice: Callable[[str], None] | None = None,
) -> TuneRecord:
    assert options.study_name is not None
    if runner is None and machine.nnodes > 1:
        assert options.rdzv_endpoint is not None
        runner = AgentRunner(storage=options.storage, study_name=options.study_name,
                             nnodes=machine.nnodes, nproc=machine.nproc_per_node,
                             rdzv_endpoint=options.rdzv_endpoint,
                             join_timeout_s=options.join_timeout_s)  # fmt: skip
    # The storage is opened (and the study created) before any measurement, so a bad
    # --storage costs nothing; tune() opens it again, which is cheap.
    saved = (
        read_record(options.profile_path, ProfileRecord, "profile")
        if options.profile_path
        else None
    )
    study = open_study(options.storage, options.study_name)
    from autotune.runtime.identity import measured_on

    check_identity(study, measured_on(model_path, machine.device), options.study_name)
    began = time.monotonic()
    shared_note = None
    if saved is None:  # the study's profiles: one set per study, so every worker predicts alike
        shared, shared_note = shared_profiles(
            study, lambda: _fresh_profiles(model_path, options, machine)
        )
        composition = _composed(shared.profile, options, machine)
    else:
        composition = tune_composition(model_path, saved, options, machine)
    profiled = time.monotonic() - began
    record, machine = composition.profile, composition.machine
    assert record is not None and composition.policy is not None
    policy, blocked = _loader_knobs(model_path, composition.policy, record.config.batch_size)
    stack = record.model.block_stack
    settings = trial_settings(str(Path(model_path).resolve()), options, machine,
                              default_guard(machine.nproc_per_node))  # fmt: skip
    if notice is not None:  # the model ran: what remains before the first trial is start-up
        notice("starting the trial workers")
    mark = time.monotonic()
    with contextlib.ExitStack() as owned:
        if runner is None:
            from autotune.runtime.extensions import recover_build_locks
            from autotune.runtime.trial.entry_points import ENTRY_POINTS

            runner = owned.enter_context(
                PoolRunner(entry_points=ENTRY_POINTS, before_launch=recover_build_locks)
            )
        elif isinstance(runner, AgentRunner):
            owned.callback(runner.close)
        starting = time.monotonic() - mark
        tuned = tune(
            label, options=options, machine=machine, settings=settings, runner=runner,
            blocks=stack.count if stack else 0, policy=policy, predict=composition.prediction,
            relink=lambda link: composition.on_link(link).prediction,
            code_changes=composition.code_changes, progress=progress,
            overhead_s=profiled + starting,
        )  # fmt: skip
    wall = tuned.wall_time
    if wall is not None:  # the profile and the workers' start-up came before the search
        wall = wall.with_phases(total_s=time.monotonic() - began, profile_s=profiled,
                                startup_s=starting)  # fmt: skip
    tuned = tuned.model_copy(update={"block_stack": stack, "wall_time": wall})
    first = [note for note in (shared_note, blocked) if note is not None]
    if first:
        tuned = tuned.model_copy(update={"notes": [*first, *tuned.notes]})
    if tuned.recommendation is None:
        return tuned
    # The trials sized ZeRO's buckets to the model; the emitted config must do the same.
    rec = tuned.recommendation.model_copy(update={"parameters": record.model.parameters})
    return tuned.model_copy(update={"recommendation": rec})


def tune_composition(
    model_path: str, saved: ProfileRecord | None, options: TuneOptions, machine: Machine
) -> Composition:
    """What tune plans with: the saved profile (the precisions it lacks traced from the model
    file), else two short fresh ones (:func:`autotune.compose.short_profiles`), composed on
    the machine for the global batch and the policy file."""
    if saved is not None:
        return _composed(compose.completed(saved, model_path), options, machine)
    return _composed(_fresh_profiles(model_path, options, machine), options, machine)


def _fresh_profiles(model_path: str, options: TuneOptions, machine: Machine) -> ProfileRecord:
    per_rank = options.global_batch // machine.world_size
    return compose.short_profiles(model_path, per_rank, machine.device)


def _composed(record: ProfileRecord, options: TuneOptions, machine: Machine) -> Composition:
    return compose.compose(record, machine=machine, global_batch=options.global_batch,
                           policy_path=options.policy_path)  # fmt: skip


def _loader_knobs(model_path: str, policy: Plan, batch_size: int) -> tuple[Plan, str | None]:
    """The policy's plan without loader knobs this model file cannot take, and why."""
    if not (policy.dataloader_workers or policy.pin_memory):
        return policy, None
    from autotune.runtime.modelfile import load_model_file

    blocked = load_model_file(model_path).loader_knobs_blocked(batch_size)
    if blocked is None:
        return policy, None
    plain = policy.with_changes(dataloader_workers=0, pin_memory=False)
    return (
        plain,
        f"the policy's DataLoader workers were not applied (trials ran without): {blocked}",
    )


def serve_agent(storage: str | None, study_name: str, **options: Any) -> int:
    """``autotune agent``: :func:`autotune.search.serve` with the trial processes injected."""
    from autotune.runtime.trial.entry_points import ENTRY_POINTS

    return serve(storage, study_name, entry_points=ENTRY_POINTS, **options)
