"""The composer: wires the stages into the one-call API (``tune``, ``recommend``, ``confirm``,
``deepspeed_config``). The only module that calls both the pure stages and the runtime.

Runtime modules are imported inside the functions, so ``autotune config`` and
``autotune suggest`` never import torch through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.confirm import ConfirmRecord, confirm_changes
from autotune.emit import Config, code_changes_for, emit_deepspeed_config
from autotune.estimator import (
    ActivationSpec,
    estimate_plan,
    facts_from_profile,
    fit_step_time,
    with_activations,
)
from autotune.policy import load_policy, policy_plan
from autotune.records import (
    AUTOCAST_PLAN_PRECISION,
    AutotuneError,
    Capabilities,
    Machine,
    Plan,
    ProfileRecord,
    Recommendation,
    TuneOptions,
    format_bytes,
    parse_bytes,
    read_record,
)
from autotune.search import (
    AgentRunner,
    PoolRunner,
    Predict,
    Prediction,
    Progress,
    TrialRunner,
    TuneRecord,
    check_identity,
    open_study,
    parse_endpoint,
    serve,
    trial_settings,
    tune,
)

GUARD_SHARE = 0.5
"""Share of the machine's available RAM all ranks of a trial may use together."""


def load_profile(
    model_path: str, profile_path: str | None, per_rank: int, device: str
) -> ProfileRecord:
    """The saved profile, or a short fresh one (2 measured steps at micro-batch <= 2)."""
    if profile_path is not None:
        return read_record(profile_path, ProfileRecord, "profile")
    from autotune.runtime.profiler import profile

    return profile(model_path, batch_size=min(2, per_rank), steps=2, warmup=1, device=device)


def time_profile(
    model_path: str, record: ProfileRecord, per_rank: int, device: str
) -> ProfileRecord | None:
    """A second short profile at a larger batch (``None`` when the per-rank batch is no larger).

    With it the step-time model splits each phase into a fixed part per micro-batch and a
    part per sample, which is what ranks micro-batches of one global batch.
    """
    batch = min(per_rank, 4 * record.config.batch_size)
    if batch <= record.config.batch_size:
        return None
    from autotune.runtime.profiler import profile

    return profile(model_path, batch_size=batch, steps=3, warmup=1, device=device)


def make_predict(
    profile: ProfileRecord,
    machine: Machine,
    refine: list[ProfileRecord] | None = None,
    activations: dict[str, ActivationSpec] | None = None,
) -> Predict:
    """The estimate as a ``plan -> Prediction`` function (pure once the facts are read).

    ``machine``: the budget and margin a plan must fit in (:attr:`Machine.usable`) and the
    links the communication time uses. ``refine``: more profiles of the same model (another
    batch size, or checkpointing switched) that the step-time model is fitted to
    (:func:`fit_step_time`). ``activations``: traced figures of precisions the profile lacks
    (:func:`traced_precisions`), used instead of deriving them from its own by formula.
    """
    facts = with_activations(facts_from_profile(profile), activations or {})
    for other in refine or []:
        facts = fit_step_time(facts, other)

    def predict(plan: Plan) -> Prediction:
        estimate = estimate_plan(facts, plan, machine=machine)
        peak, ratio = estimate.memory.peak, estimate.predicted_step_time_ratio
        if estimate.fits is not False:
            return Prediction(True, peak, estimate.source, step_time_ratio=ratio)
        reason = (f"peak {format_bytes(peak)} > usable part of "
                  f"{format_bytes(machine.device_memory)} ({estimate.source})")  # fmt: skip
        return Prediction(False, peak, estimate.source, reason, step_time_ratio=ratio)

    return predict


def traced_precisions(
    model_path: str, record: ProfileRecord, policy: Plan, options: TuneOptions
) -> dict[str, ActivationSpec]:
    """Activation figures traced on fake tensors for the precisions the search can take that
    the profile did not measure (the policy's plan and the baseline's): a 16-bit plan's
    activations are not half of fp32's (fp32 norms, softmax and loss), see bench/RESULTS.md
    "bf16 plans". Seconds on fake tensors; nothing allocated. Where no trace path runs, the
    estimate keeps its formula (its note says so).
    """
    from autotune.runtime.trace import traced_activations

    measured = AUTOCAST_PLAN_PRECISION[record.config.precision]
    wanted = {policy.precision, (options.baseline or Plan()).precision} - {measured}
    try:
        return traced_activations(model_path, tuple(sorted(wanted)))
    except AutotuneError:
        return {}


def default_guard(nproc: int) -> int:
    """RSS per rank above which a trial stops itself, so the machine never meets its OOM killer.

    Read after this process has handed back what its profiling freed.
    """
    import psutil

    from autotune.runtime.profiler import return_freed_memory

    return_freed_memory()
    return int(psutil.virtual_memory().available * GUARD_SHARE / nproc)


_ALIASES = {"nproc": "gpus_per_node", "nproc_per_node": "gpus_per_node", "nnodes": "nodes"}


def tune_records(
    options: TuneOptions | None, machine: Machine | None, fields: Mapping[str, Any]
) -> tuple[TuneOptions, Machine]:
    """The run's two records: those given, or built from keyword ``fields`` named as their
    fields (``nproc`` for ``gpus_per_node``, ``nnodes`` for ``nodes``).

    Raises:
        AutotuneError: a keyword neither record has, or one given beside its record.
    """
    names = {"options": {f.name for f in dataclasses.fields(TuneOptions)},
             "machine": {f.name for f in dataclasses.fields(Machine)}}  # fmt: skip
    given: dict[str, dict[str, Any]] = {"options": {}, "machine": {}}
    for key, value in fields.items():
        name = _ALIASES.get(key, key)
        owner = next((kind for kind, known in names.items() if name in known), None)
        if owner is None:
            raise AutotuneError(
                f"tune: unknown option {key!r} (not a field of TuneOptions or Machine)"
            )
        if name == "device_memory" and isinstance(value, str):
            value = parse_bytes(value, "device_memory")
        given[owner][name] = value
    if options is not None and given["options"]:
        raise AutotuneError(f"tune: {', '.join(given['options'])} given beside options=")
    if machine is not None and given["machine"]:
        raise AutotuneError(f"tune: {', '.join(given['machine'])} given beside machine=")
    return (options or TuneOptions(**given["options"]),
            machine or Machine(**given["machine"]))  # fmt: skip


def check_model_path(model_path: str | None) -> None:
    """Refuse a model file that is missing or a directory (``None``: a Hugging Face entry,
    checked by its loader).

    Raises:
        AutotuneError: one line naming the path.
    """
    if model_path is not None and Path(model_path).is_dir():
        raise AutotuneError(f"{model_path}: is a directory, not a model file")
    if model_path is not None and not Path(model_path).is_file():
        raise AutotuneError(f"{model_path}: no such model file")


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
    if launches and machine.nodes > 1 and options.rdzv_endpoint is None:
        raise AutotuneError(
            f"--nnodes {machine.nodes}: give --rdzv-endpoint HOST:PORT on one of the nodes"
        )
    if launches and machine.nodes > 1 and options.rdzv_endpoint:
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
            (``nproc`` for ``gpus_per_node``).
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
        ``tune_model("model.py", global_batch=64, nproc=2, device_memory="2GiB")``
    """
    from autotune.runtime.hf import model_source

    options, machine = tune_records(options, machine, fields)
    check_tune(options, machine, model_path, launches=runner is None)
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len,
                      task=task) as src:  # fmt: skip
        if options.study_name is None:
            name = f"{src.stem}-g{options.global_batch}-n{machine.gpus_per_node}"
            options = dataclasses.replace(options, study_name=name)
        return _tune_file(str(src.path), src.label, options, machine, runner, progress, notice)


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
    if runner is None and machine.nodes > 1:
        assert options.rdzv_endpoint is not None
        runner = AgentRunner(storage=options.storage, study_name=options.study_name,
                             nnodes=machine.nodes, nproc=machine.gpus_per_node,
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
    per_rank = options.global_batch // machine.world_size
    record = saved or load_profile(model_path, None, per_rank, machine.device)
    second = time_profile(model_path, record, per_rank, machine.device) if saved is None else None
    machine = machine.with_default_budget(record)
    refine = [second] if second is not None else []
    policy = policy_plan(record, machine=machine, global_batch=options.global_batch,
                         policy_path=options.policy_path, more_profiles=refine)  # fmt: skip
    policy, blocked = _loader_knobs(model_path, policy, record.config.batch_size)
    stack = record.model.block_stack
    settings = trial_settings(str(Path(model_path).resolve()), options, machine,
                              default_guard(machine.gpus_per_node))  # fmt: skip

    def changes(plan: Plan) -> list[Any]:
        return code_changes_for(plan, block_stack_path=stack.path if stack else None,
                                num_blocks=stack.count if stack else None,
                                model_class=record.model.class_name)  # fmt: skip

    traced = traced_precisions(model_path, record, policy, options)
    predict = make_predict(record, machine, refine, traced)
    if notice is not None:  # the model ran: what remains before the first trial is start-up
        notice("starting the trial workers (a first DeepSpeed start compiles its comm op: "
               "about a minute)")  # fmt: skip
    if runner is None and machine.nodes == 1:  # DeepSpeed's comm op, built once with a deadline
        from autotune.runtime.extensions import prepare_deepspeed

        prepare_deepspeed(machine.device, settings.timeout_s)
    with contextlib.ExitStack() as owned:
        if runner is None:
            from autotune.runtime.extensions import recover_build_locks
            from autotune.runtime.trial.entry_points import ENTRY_POINTS

            runner = owned.enter_context(
                PoolRunner(entry_points=ENTRY_POINTS, before_launch=recover_build_locks)
            )
        elif isinstance(runner, AgentRunner):
            owned.callback(runner.close)
        tuned = tune(
            label, options=options, machine=machine, settings=settings, runner=runner,
            blocks=stack.count if stack else 0, policy=policy, predict=predict,
            code_changes=changes, progress=progress,
        )  # fmt: skip
    tuned = tuned.model_copy(update={"block_stack": stack})
    if blocked is not None:
        tuned = tuned.model_copy(update={"notes": [blocked, *tuned.notes]})
    if tuned.recommendation is None:
        return tuned
    # The trials sized ZeRO's buckets to the model; the emitted config must do the same.
    rec = tuned.recommendation.model_copy(update={"parameters": record.model.parameters})
    return tuned.model_copy(update={"recommendation": rec})


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


def recommend(
    model_file_or_callables: str | Path | Mapping[str, Callable[..., Any]] | None = None,
    *,
    global_batch: int,
    world_size: int = 1,
    search: bool = False,
    machine: Machine | None = None,
    options: TuneOptions | None = None,
    runner: TrialRunner | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
    **fields: Any,
) -> Recommendation:
    """The whole loop from Python: profile, then the policy's plan or a tuning search.

    Args:
        model_file_or_callables: a model file (``build_model()`` and
            ``build_batch(batch_size)`` or ``build_dataloader(batch_size)``, optional
            ``loss_fn`` and ``build_optimizer``, as ``autotune profile`` reads it), or
            those hooks as a dict of module-level functions. Omit it to give
            ``hf_config`` or ``hf_model`` instead.
        global_batch: samples per optimizer step over all ranks, kept by every plan.
        world_size: data-parallel ranks the plan is for (with ``search``, trials
            run this many processes here).
        search: ``False`` profiles once and takes the policy's plan; ``True`` runs
            real trials (``autotune tune``) and takes the measured best.
        machine: the target machine; or its fields as keywords: ``device`` (where to
            profile and run trials), ``device_memory`` (bytes, or a string such as
            ``"80GiB"``; default: the profiled GPU's, or this CPU's available memory),
            ``margin``, ``gpus_per_node`` (when ``world_size`` spans nodes), ``inter_gbps``.
        options: with ``search``, what the search is asked (:class:`TuneOptions`); or its
            fields as keywords (``trials``, ``budget_s``, ``steps``, ``storage``, ...).
            Without ``search`` they would be ignored, so they are refused.
        runner: with ``search``, launches the trials (default: a pooled runner here).
        hf_config: a transformers config (``config.json``, model directory or Hub
            name) to build with random init and feed synthetic token batches.
        hf_model: weights to load with ``from_pretrained`` (a local directory, or a
            Hub name), fed synthetic token batches.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        task: the head to build with ``hf_config``/``hf_model`` (default: from the config).
        **fields: fields of :class:`Machine` and (with ``search``) of :class:`TuneOptions`.

    Returns:
        A :class:`Recommendation`; :func:`deepspeed_config` (or, for an ``engine=fsdp2``
        plan, :func:`fsdp2_config`) turns it into a ready config.

    Raises:
        AutotuneError: bad arguments, a broken model file, or a search in which
            no trial succeeded.
    """
    if global_batch < 1 or world_size < 1 or global_batch % world_size:
        raise AutotuneError(
            f"recommend: global_batch {global_batch} must be a positive multiple of world_size {world_size}"
        )
    per_node = fields.pop("gpus_per_node", None) or world_size
    if machine is None:
        if world_size % per_node:
            raise AutotuneError(
                f"recommend: gpus_per_node {per_node} does not divide world_size {world_size}"
            )
        fields.update(gpus_per_node=per_node, nodes=world_size // per_node)
    tune_fields = {f.name for f in dataclasses.fields(TuneOptions)}
    if not search and (options is not None or runner is not None or set(fields) & tune_fields):
        ignored = sorted(set(fields) & tune_fields) + ["options"] * (options is not None) + [
            "runner"] * (runner is not None)  # fmt: skip
        raise AutotuneError(f"recommend: {', '.join(ignored)} apply to search=True only")
    options, machine = tune_records(options, machine, {"global_batch": global_batch, **fields}
                                    if options is None else fields)  # fmt: skip
    if not isinstance(model_file_or_callables, Mapping):
        from autotune.runtime.hf import model_source

        with model_source(model_file_or_callables, hf_config=hf_config, hf_model=hf_model,
                          seq_len=seq_len, task=task) as source:  # fmt: skip
            rec = _recommend(source.path, search, options, machine, runner)
        return rec.model_copy(update={"model_file": source.label})
    with tempfile.TemporaryDirectory(prefix="autotune-hooks-") as directory:
        shim = Path(directory) / "hooks.py"
        shim.write_text(hooks_model_file(model_file_or_callables), encoding="utf-8")
        rec = _recommend(shim, search, options, machine, runner)
    names = ", ".join(
        f"{fn.__module__}.{fn.__qualname__}" for fn in model_file_or_callables.values()
    )
    return rec.model_copy(update={"model_file": f"callables: {names}"})


HOOKS = ("build_model", "build_batch", "build_dataloader", "loss_fn", "build_optimizer")


def hooks_model_file(hooks: Mapping[str, Callable[..., Any]]) -> str:
    """A model file that imports the given hooks by reference (trials run in child processes).

    Raises:
        AutotuneError: an unknown hook name, or a function a child process cannot import
            (a lambda or a function defined inside another function).
    """
    lines = ["import importlib.util, sys", f"sys.path[:0] = {sys.path!r}"]
    for name, fn in hooks.items():
        qualname = getattr(fn, "__qualname__", "")
        if name not in HOOKS:
            raise AutotuneError(f"recommend: unknown hook {name!r} (known: {', '.join(HOOKS)})")
        if not callable(fn) or not qualname or "<" in qualname or "." in qualname:
            raise AutotuneError(
                f"recommend: {name} must be a module-level function (trials import it)"
            )
        source = getattr(sys.modules.get(fn.__module__), "__file__", None)
        if fn.__module__ == "__main__" and source:
            # Loaded under another name, so the script's `if __name__ == "__main__":` does not rerun.
            lines += [f"_spec = importlib.util.spec_from_file_location('_autotune_main', {source!r})",
                      "_main = importlib.util.module_from_spec(_spec)", "_spec.loader.exec_module(_main)",
                      f"{name} = _main.{qualname}"]  # fmt: skip
        else:
            lines.append(f"from {fn.__module__} import {qualname} as {name}")
    return "\n".join(lines) + "\n"


def _recommend(model_file: Path, search: bool, options: TuneOptions, machine: Machine,
               runner: TrialRunner | None) -> Recommendation:  # fmt: skip
    if not search:
        return _recommend_by_policy(model_file, options.global_batch, machine)
    record = tune_model(str(model_file), options=options, machine=machine, runner=runner)
    if record.recommendation is None:
        raise AutotuneError(
            f"recommend: no trial of {model_file} succeeded, so nothing to recommend"
        )
    return record.recommendation


def _recommend_by_policy(
    model_file: str | Path, global_batch: int, machine: Machine
) -> Recommendation:
    from autotune.runtime.profiler import profile

    # A short profile at a small share of the per-rank batch, as `autotune tune` takes.
    per_rank = global_batch // machine.world_size
    record = profile(
        model_file, batch_size=min(2, per_rank), steps=2, warmup=1, device=machine.device
    )
    plan = policy_plan(
        record, machine=machine.with_default_budget(record), global_batch=global_batch
    )
    stack = record.model.block_stack
    return Recommendation(
        source="suggest",
        plan=plan,
        model_file=str(model_file),
        code_changes=code_changes_for(
            plan,
            block_stack_path=stack.path if stack else None,
            num_blocks=stack.count if stack else None,
            model_class=record.model.class_name,
        ),  # fmt: skip
        notes=[
            "from one short profile and the policy's rules; not confirmed by trials (search=True is)"
        ],
        capabilities=record.environment.capabilities,
        parameters=record.model.parameters,
    )


def deepspeed_config(
    plan_or_recommendation: Plan | Recommendation,
    *,
    world_size: int | None = None,
    base: Config | None = None,
    hf_auto: bool = False,
    nvme_path: str | None = None,
    capabilities: Capabilities | None = None,
    parameters: int | None = None,
) -> Config:
    """A ready DeepSpeed config for a plan, checked by autotune and by DeepSpeed itself.

    Takes the arguments of :func:`autotune.emit.emit_deepspeed_config`; when DeepSpeed is
    installed its own ``DeepSpeedConfig`` validates the result at ``world_size``.

    Example:
        >>> from autotune import Plan, deepspeed_config
        >>> cfg = deepspeed_config(Plan(zero_stage=2, micro_batch=4, grad_accum=2, precision="bf16"),
        ...                        world_size=8)
        >>> cfg["train_batch_size"], cfg["zero_optimization"]["stage"], cfg["bf16"]["enabled"]
        (64, 2, True)
    """
    from autotune.runtime.ds_validate import validate_with_deepspeed

    emitted = emit_deepspeed_config(
        plan_or_recommendation, world_size=world_size, base=base, hf_auto=hf_auto,
        nvme_path=nvme_path, capabilities=capabilities, parameters=parameters,
    )  # fmt: skip
    validate_with_deepspeed(emitted.resolved, world_size=emitted.world_size)
    return emitted.config


def fsdp2_config(
    plan_or_recommendation: Plan | Recommendation,
    *,
    world_size: int | None = None,
    block_stack: str | None = None,
    layer_class: str | None = None,
    num_blocks: int | None = None,
) -> dict[str, Any]:
    """The FSDP2 deliverable of an ``engine=fsdp2`` plan, as a JSON-ready dict.

    Keys: ``plan``, ``block_stack`` and ``block_stack_from_model``, ``code`` (checkpointing
    of the plan's K blocks, ``fully_shard`` per block, then the root), ``accelerate_config``
    (``accelerate launch --config_file``), ``accelerate_code`` (the plugin with
    ``reduce_dtype=fp32``), ``hf_trainer`` (``TrainingArguments`` keywords), ``notes``.

    Args:
        plan_or_recommendation: an ``engine=fsdp2`` plan, or a recommendation of one.
        world_size: processes in all; default the plan's gpus x nodes.
        block_stack: Python for the model's blocks, e.g. ``"model.model.layers"``
            (``emit.block_stack_expression`` of a profile's ``model.block_stack.path``);
            ``None`` uses that default and says so in the code and the notes.
        layer_class: the block class name, for Accelerate's and the Trainer's wrapping.
        num_blocks: L; Accelerate's and the Trainer's checkpointing switch is set only
            when the plan checkpoints all L blocks.

    Example:
        >>> from autotune import fsdp2_config
        >>> from autotune.records import parse_plan
        >>> out = fsdp2_config(parse_plan("engine=fsdp2,stage=3,precision=bf16,gpus=8"))
        >>> out["accelerate_config"]["fsdp_config"]["fsdp_version"], out["hf_trainer"]["fsdp"]
        (2, True)
    """
    from dataclasses import asdict

    from autotune.emit import fsdp2_deliverable

    plan = getattr(plan_or_recommendation, "plan", plan_or_recommendation)
    assert isinstance(plan, Plan)
    deliverable = fsdp2_deliverable(
        plan,
        world_size=world_size,
        block_stack=block_stack,
        layer_class=layer_class,
        num_blocks=num_blocks,
    )
    return asdict(deliverable)


def confirm(
    model_path: str | Path | None = None,
    *,
    batch_size: int,
    profile: ProfileRecord | None = None,
    device: str | None = None,
    steps: int = 3,
    repeats: int = 5,
    warmup: int = 1,
    loss_tolerance: float = 0.05,
    max_changes: int = 8,
    progress: Callable[[str], None] | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
    machine: Machine | None = None,
    global_batch: int | None = None,
    policy_path: str | Path | None = None,
    **fields: Any,
) -> ConfirmRecord:
    """Profile a baseline, then measure each proposed change against what was kept so far.

    Args:
        model_path: the user's model file (or ``hf_config``/``hf_model`` with ``seq_len``).
        batch_size: micro-batch of the baseline.
        profile: a saved baseline profile (default: profile the model now).
        device: where the steps run (``cpu``, ``cuda``, ``cuda:1``); default: the device the
            profile ran on, or ``auto`` without a profile.
        steps: timed steps per arm in each repeat.
        repeats: interleaved A/B repeats (the interval comes from their spread).
        warmup: untimed steps per arm before the first repeat.
        loss_tolerance: largest relative difference of the mean loss accepted.
        max_changes: most changes proposed in one session.
        progress: called with one line per event (the CLI prints them to stderr).
        hf_config: a transformers config instead of a model file (random init, token batches).
        hf_model: weights to load with ``from_pretrained`` instead of a model file.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        task: the head to build with ``hf_config``/``hf_model`` (default: from the config).
        machine: the target machine the policy plans for; or its fields as keywords
            (``device_memory`` in bytes or as ``"80GiB"``, ``margin``, ...).
        global_batch: the target global batch the policy keeps.
        policy_path: a policy TOML file (default: the default policy).
        **fields: fields of :class:`Machine`, when ``machine`` is not given.
    """
    from autotune.runtime.hf import model_source

    if steps < 1 or repeats < 1:
        raise AutotuneError("--steps and --repeats must be at least 1")
    if profile is not None and profile.config.batch_size != batch_size:
        raise AutotuneError(
            f"--batch-size {batch_size} differs from the profile's batch size "
            f"{profile.config.batch_size}"
        )
    where = device or (profile.config.device if profile is not None else "auto")
    if machine is None:
        _, machine = tune_records(None, None, {"global_batch": 1, "device": where, **fields})
    elif fields:
        raise AutotuneError(f"confirm: {', '.join(fields)} given beside machine=")
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len,
                      task=task) as src:  # fmt: skip
        return _confirm_file(
            src.path, src.label, batch_size=batch_size, profile=profile, device=where,
            steps=steps, repeats=repeats, warmup=warmup, loss_tolerance=loss_tolerance,
            max_changes=max_changes, say=progress or (lambda line: None), machine=machine,
            global_batch=global_batch, policy_path=policy_path,
        )  # fmt: skip


def _confirm_file(
    path: Path, label: str, *, batch_size: int, profile: ProfileRecord | None, device: str,
    steps: int, repeats: int, warmup: int, loss_tolerance: float, max_changes: int,
    say: Callable[[str], None], machine: Machine, global_batch: int | None,
    policy_path: str | Path | None,
) -> ConfirmRecord:  # fmt: skip
    from autotune.runtime.ab import measure
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.profiler import profile as run_profile

    model_file = load_model_file(path)
    if profile is None:
        say(f"profiling the baseline at batch size {batch_size} on {device}")
        profile = run_profile(
            path, batch_size=batch_size, steps=max(steps, 3), warmup=warmup,
            device=device, precision="fp32", checkpointing=False, label=label,
        )  # fmt: skip

    def measure_pair(before: Plan, after: Plan) -> dict[str, Any]:
        return measure(model_file, before, after, device=device, steps=steps, repeats=repeats,
                       warmup=warmup)  # fmt: skip

    return confirm_changes(
        profile, measure_pair, model_file=label, device=device, repeats=repeats,
        steps=steps, loss_tolerance=loss_tolerance, max_changes=max_changes, progress=say,
        machine=machine.with_default_budget(profile), global_batch=global_batch,
        policy_path=policy_path,
    )  # fmt: skip
