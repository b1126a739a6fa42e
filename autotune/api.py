"""The composer: wires the stages into the one-call API (``tune``, ``recommend``, ``confirm``,
``deepspeed_config``). The only module that calls both the pure stages and the runtime.

Runtime modules are imported inside the functions, so ``autotune config`` and
``autotune suggest`` never import torch through here.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.confirm import ConfirmRecord, confirm_changes
from autotune.emit import Config, code_changes_for, emit_deepspeed_config
from autotune.estimator import DEFAULT_MARGIN, estimate_plan, facts_from_profile, fit_step_time
from autotune.policy import load_policy, policy_plan
from autotune.records import (
    AutotuneError,
    Capabilities,
    Plan,
    ProfileRecord,
    Recommendation,
    format_bytes,
    read_record,
)
from autotune.search import (
    JOIN_TIMEOUT_S,
    AgentRunner,
    PoolRunner,
    Predict,
    Prediction,
    Progress,
    TrialRunner,
    TrialSettings,
    TuneRecord,
    open_study,
    parse_endpoint,
    serve,
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
    device_memory: int | None,
    inter_gbps: float | None = None,
    refine: list[ProfileRecord] | None = None,
    margin: float = DEFAULT_MARGIN,
) -> Predict:
    """The estimate as a ``plan -> Prediction`` function (pure once the facts are read).

    ``inter_gbps``: the link between nodes, which the estimate's communication time uses
    for plans over several nodes. ``refine``: more profiles of the same model (another
    batch size, or checkpointing switched) that the step-time model is fitted to
    (:func:`fit_step_time`). ``margin``: the share of ``device_memory`` kept free; a plan
    fits when its predicted peak is at most the rest.
    """
    facts = facts_from_profile(profile)
    for other in refine or []:
        facts = fit_step_time(facts, other)

    def predict(plan: Plan) -> Prediction:
        estimate = estimate_plan(
            facts, plan, device_memory=device_memory, inter_gbps=inter_gbps, margin=margin
        )
        peak, ratio = estimate.memory.peak, estimate.predicted_step_time_ratio
        if estimate.fits is not False:
            return Prediction(True, peak, estimate.source, step_time_ratio=ratio)
        reason = f"peak {format_bytes(peak)} > usable part of {format_bytes(device_memory)} ({estimate.source})"
        return Prediction(False, peak, estimate.source, reason, step_time_ratio=ratio)

    return predict


def default_guard(nproc: int) -> int:
    """RSS per rank above which a trial stops itself, so the machine never meets its OOM killer."""
    import psutil

    return int(psutil.virtual_memory().available * GUARD_SHARE / nproc)


def check_tune_options(
    model_path: str | None,
    global_batch: int,
    nproc: int,
    nodes: int,
    rdzv_endpoint: str | None,
    *,
    baseline: Plan | None = None,
    policy_path: str | None = None,
) -> None:
    """Every check of ``autotune tune``'s options that needs no work: one line each.

    ``model_path=None``: a Hugging Face entry, checked by its loader; ``rdzv_endpoint=""``:
    the caller brings its own runner.

    Raises:
        AutotuneError: one line naming the model file or the flag.
    """
    if model_path is not None and Path(model_path).is_dir():
        raise AutotuneError(f"{model_path}: is a directory, not a model file")
    if model_path is not None and not Path(model_path).is_file():
        raise AutotuneError(f"{model_path}: no such model file")
    for flag, value in (("--global-batch", global_batch), ("--nproc", nproc), ("--nnodes", nodes)):
        if value < 1:
            raise AutotuneError(f"{flag}: must be >= 1 (got {value})")
    if global_batch % (nproc * nodes):
        ranks = f"--nproc {nproc}" + (f" x --nnodes {nodes}" if nodes != 1 else "")
        raise AutotuneError(f"--global-batch {global_batch} does not split over {ranks}")
    if nodes > 1 and rdzv_endpoint is None:
        raise AutotuneError(f"--nnodes {nodes}: give --rdzv-endpoint HOST:PORT on one of the nodes")
    if nodes > 1 and rdzv_endpoint:
        parse_endpoint(rdzv_endpoint)
    if baseline is not None and baseline.global_batch != global_batch:
        raise AutotuneError(
            f"--baseline: global batch {baseline.global_batch} != --global-batch {global_batch}"
        )
    load_policy(policy_path)


def tune_model(
    model_path: str | None = None,
    *,
    global_batch: int,
    nproc: int = 1,
    device: str = "auto",
    device_memory: int | None = None,
    profile_path: str | None = None,
    policy_path: str | None = None,
    baseline: Plan | None = None,
    steps: int = 3,
    warmup: int = 1,
    interval_width: float | None = 0.05,
    max_steps: int = 20,
    trial_timeout: float = 600.0,
    runner: TrialRunner | None = None,
    progress: Callable[[Progress], None] | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    nodes: int = 1,
    rdzv_endpoint: str | None = None,
    join_timeout: float = JOIN_TIMEOUT_S,
    inter_gbps: float | None = None,
    margin: float = DEFAULT_MARGIN,
    **options: Any,
) -> TuneRecord:
    """Everything ``autotune tune`` does before and around :func:`tune`.

    Reads or takes two short profiles (two batch sizes, so the step-time model can rank
    micro-batches), asks the policy for its plan and the estimate for every plan's fit
    and speed, then searches with real trials: by default in a :class:`PoolRunner`, so
    start-up is paid once per rank count. Each trial measures at least ``steps`` steps and
    then until its median step time is known to ``interval_width`` (or ``max_steps``).
    ``options`` go to :func:`tune` (trials, budget_s, storage, study_name, repeats, front,
    heartbeat_s; the
    study's name defaults to ``<model stem>-g<global batch>-n<nproc>``). Instead of
    ``model_path``, ``hf_config`` or ``hf_model`` with ``seq_len`` name a Hugging
    Face model (:func:`autotune.runtime.hf.model_source`). With ``nodes`` > 1 each
    trial spans that many nodes: an ``autotune agent`` on every node launches its
    ``nproc`` ranks, meeting at ``rdzv_endpoint`` (HOST:PORT). ``margin``: the share of
    ``device_memory`` the estimate keeps free when it prunes plans that cannot fit.
    """
    from autotune.runtime.hf import model_source

    check_tune_options(None, global_batch, nproc, nodes, rdzv_endpoint if runner is None else "")
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len) as src:
        if options.get("study_name") is None:
            options["study_name"] = f"{src.stem}-g{global_batch}-n{nproc}"
        return _tune_file(
            str(src.path), src.label, global_batch=global_batch, nproc=nproc, device=device,
            device_memory=device_memory, profile_path=profile_path, policy_path=policy_path,
            baseline=baseline, steps=steps, warmup=warmup, interval_width=interval_width,
            max_steps=max_steps, trial_timeout=trial_timeout,
            runner=runner, progress=progress, nodes=nodes, rdzv_endpoint=rdzv_endpoint,
            join_timeout=join_timeout, inter_gbps=inter_gbps, margin=margin, **options,
        )  # fmt: skip


def _tune_file(
    model_path: str,
    label: str,
    *,
    global_batch: int,
    nproc: int,
    device: str,
    device_memory: int | None,
    profile_path: str | None,
    policy_path: str | None,
    baseline: Plan | None,
    steps: int,
    warmup: int,
    interval_width: float | None,
    max_steps: int,
    trial_timeout: float,
    runner: TrialRunner | None,
    progress: Callable[[Progress], None] | None,
    nodes: int,
    rdzv_endpoint: str | None,
    join_timeout: float,
    inter_gbps: float | None,
    margin: float,
    **options: Any,
) -> TuneRecord:
    check_tune_options(
        model_path, global_batch, nproc, nodes, rdzv_endpoint if runner is None else "",
        baseline=baseline, policy_path=policy_path,
    )  # fmt: skip
    world = nproc * nodes
    if runner is None and nodes > 1:
        assert rdzv_endpoint is not None
        runner = AgentRunner(storage=options.get("storage"), study_name=options["study_name"],
                             nnodes=nodes, nproc=nproc, rdzv_endpoint=rdzv_endpoint,
                             join_timeout_s=join_timeout)  # fmt: skip
    # The storage is opened (and the study created) before any measurement, so a bad
    # --storage costs nothing; tune() opens it again, which is cheap.
    saved = read_record(profile_path, ProfileRecord, "profile") if profile_path else None
    open_study(options.get("storage"), options["study_name"])
    per_rank = global_batch // world
    record = saved or load_profile(model_path, None, per_rank, device)
    second = time_profile(model_path, record, per_rank, device) if saved is None else None
    if device_memory is None and record.environment.device_type == "cuda":
        device_memory = record.environment.device_memory_bytes
    refine = [second] if second is not None else []
    policy = policy_plan(record, device_memory=device_memory, world_size=world, gpus_per_node=nproc,
                         inter_gbps=inter_gbps, global_batch=global_batch, policy_path=policy_path,
                         more_profiles=refine)  # fmt: skip
    policy, blocked = _loader_knobs(model_path, policy, record.config.batch_size)
    stack = record.model.block_stack
    settings = TrialSettings(
        model_file=str(Path(model_path).resolve()), steps=steps, warmup=warmup, device=device,
        device_memory=device_memory, memory_guard=default_guard(nproc), timeout_s=trial_timeout,
        interval_width=interval_width, max_steps=max(max_steps, steps),
    )  # fmt: skip

    def changes(plan: Plan) -> list[Any]:
        return code_changes_for(plan, block_stack_path=stack.path if stack else None,
                                num_blocks=stack.count if stack else None)  # fmt: skip

    predict = make_predict(record, device_memory, inter_gbps, refine, margin)
    with contextlib.ExitStack() as owned:
        if runner is None:
            from autotune.runtime.trial.entry_points import ENTRY_POINTS

            runner = owned.enter_context(PoolRunner(entry_points=ENTRY_POINTS))
        elif isinstance(runner, AgentRunner):
            owned.callback(runner.close)
        tuned = tune(
            label, global_batch=global_batch, settings=settings, runner=runner,
            nproc=nproc, nodes=nodes, blocks=stack.count if stack else 0, policy=policy,
            baseline=baseline, predict=predict, code_changes=changes, progress=progress,
            **options,
        )  # fmt: skip
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
    device_memory: int | None = None,
    search: bool = False,
    device: str = "auto",
    gpus_per_node: int | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    **options: Any,
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
        device_memory: bytes per device to plan for; ``None`` uses the profiled device's.
        search: ``False`` profiles once and takes the policy's plan; ``True`` runs
            real trials (``autotune tune``) and takes the measured best.
        device: where to profile and run trials (``auto``, ``cpu``, ``cuda``).
        gpus_per_node: devices per node, when ``world_size`` spans several nodes.
        hf_config: a transformers config (``config.json``, model directory or Hub
            name) to build with random init and feed synthetic token batches.
        hf_model: weights to load with ``from_pretrained`` (a local directory, or a
            Hub name), fed synthetic token batches.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        **options: passed on to the search when ``search`` is true (``trials``,
            ``budget_s``, ``steps``, ``storage``, ``runner``, ...).

    Returns:
        A :class:`Recommendation`; its ``deepspeed_config()`` is the config dict.

    Raises:
        AutotuneError: bad arguments, a broken model file, or a search in which
            no trial succeeded.
    """
    if global_batch < 1 or world_size < 1 or global_batch % world_size:
        raise AutotuneError(
            f"recommend: global_batch {global_batch} must be a positive multiple of world_size {world_size}"
        )
    if not isinstance(model_file_or_callables, Mapping):
        from autotune.runtime.hf import model_source

        with model_source(model_file_or_callables, hf_config=hf_config, hf_model=hf_model,
                          seq_len=seq_len) as source:  # fmt: skip
            rec = _recommend(source.path, search, global_batch=global_batch,
                             world_size=world_size, device_memory=device_memory, device=device,
                             gpus_per_node=gpus_per_node, **options)  # fmt: skip
        return rec.model_copy(update={"model_file": source.label})
    with tempfile.TemporaryDirectory(prefix="autotune-hooks-") as directory:
        shim = Path(directory) / "hooks.py"
        shim.write_text(hooks_model_file(model_file_or_callables), encoding="utf-8")
        rec = _recommend(shim, search, global_batch=global_batch, world_size=world_size,
                         device_memory=device_memory, device=device, gpus_per_node=gpus_per_node,
                         **options)  # fmt: skip
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


def _recommend(model_file: Path, search: bool, **kwargs: Any) -> Recommendation:
    if not search:
        options = {key: kwargs[key] for key in ("global_batch", "world_size", "device_memory",
                                                "device", "gpus_per_node")}  # fmt: skip
        return _recommend_by_policy(model_file, **options)
    kwargs.pop("gpus_per_node")
    record = tune_model(str(model_file), nproc=kwargs.pop("world_size"), **kwargs)
    if record.recommendation is None:
        raise AutotuneError(
            f"recommend: no trial of {model_file} succeeded, so nothing to recommend"
        )
    return record.recommendation


def _recommend_by_policy(
    model_file: str | Path, *, global_batch: int, world_size: int, device_memory: int | None,
    device: str, gpus_per_node: int | None,
) -> Recommendation:  # fmt: skip
    from autotune.runtime.profiler import profile

    # A short profile at a small share of the per-rank batch, as `autotune tune` takes.
    per_rank = global_batch // world_size
    record = profile(model_file, batch_size=min(2, per_rank), steps=2, warmup=1, device=device)
    plan = policy_plan(record, device_memory=device_memory, world_size=world_size,
                       gpus_per_node=gpus_per_node, global_batch=global_batch)  # fmt: skip
    stack = record.model.block_stack
    return Recommendation(
        source="suggest",
        plan=plan,
        model_file=str(model_file),
        code_changes=code_changes_for(
            plan,
            block_stack_path=stack.path if stack else None,
            num_blocks=stack.count if stack else None,
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
) -> dict[str, Any]:
    """The FSDP2 deliverable of an ``engine=fsdp2`` plan, as a JSON-ready dict.

    Keys: ``plan``, ``code`` (``fully_shard`` per block, then the root), ``accelerate_config``
    (``accelerate launch --config_file``), ``accelerate_code`` (the plugin with
    ``reduce_dtype=fp32``), ``hf_trainer`` (``TrainingArguments`` keywords), ``notes``.

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
        block_stack=block_stack or "model.model.layers",
        layer_class=layer_class,
    )
    return asdict(deliverable)


def confirm(
    model_path: str | Path | None = None,
    *,
    batch_size: int,
    profile: ProfileRecord | None = None,
    device: str = "cpu",
    steps: int = 3,
    repeats: int = 5,
    warmup: int = 1,
    loss_tolerance: float = 0.05,
    max_changes: int = 8,
    progress: Callable[[str], None] | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    **suggest_options: Any,
) -> ConfirmRecord:
    """Profile a baseline, then measure each proposed change against what was kept so far.

    Args:
        model_path: the user's model file (or ``hf_config``/``hf_model`` with ``seq_len``).
        batch_size: micro-batch of the baseline.
        profile: a saved baseline profile (default: profile the model now).
        device: where the steps run (``cpu``, ``cuda``, ``cuda:1``).
        steps: timed steps per arm in each repeat.
        repeats: interleaved A/B repeats (the interval comes from their spread).
        warmup: untimed steps per arm before the first repeat.
        loss_tolerance: largest relative difference of the mean loss accepted.
        max_changes: most changes proposed in one session.
        progress: called with one line per event (the CLI prints them to stderr).
        hf_config: a transformers config instead of a model file (random init, token batches).
        hf_model: weights to load with ``from_pretrained`` instead of a model file.
        seq_len: tokens per sample, with ``hf_config`` or ``hf_model``.
        **suggest_options: passed to :func:`autotune.policy.suggest` (device_memory, policy_path...).
    """
    from autotune.runtime.hf import model_source

    if steps < 1 or repeats < 1:
        raise AutotuneError("--steps and --repeats must be at least 1")
    if profile is not None and profile.config.batch_size != batch_size:
        raise AutotuneError(
            f"--batch-size {batch_size} differs from the profile's batch size "
            f"{profile.config.batch_size}"
        )
    with model_source(model_path, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len) as src:
        return _confirm_file(
            src.path, src.label, batch_size=batch_size, profile=profile, device=device,
            steps=steps, repeats=repeats, warmup=warmup, loss_tolerance=loss_tolerance,
            max_changes=max_changes, say=progress or (lambda line: None), **suggest_options,
        )  # fmt: skip


def _confirm_file(
    path: Path, label: str, *, batch_size: int, profile: ProfileRecord | None, device: str,
    steps: int, repeats: int, warmup: int, loss_tolerance: float, max_changes: int,
    say: Callable[[str], None], **suggest_options: Any,
) -> ConfirmRecord:  # fmt: skip
    from autotune.runtime.ab import measure
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.profiler import profile as run_profile

    model_file = load_model_file(path)
    if profile is None:
        say(f"profiling the baseline at batch size {batch_size}")
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
        **suggest_options,
    )  # fmt: skip
