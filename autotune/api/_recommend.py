"""``recommend`` from Python: the policy's plan from one profile, or the measured best of a
search, as a :class:`~autotune.records.Recommendation` with its predicted peak."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune import compose
from autotune.api._common import tune_records
from autotune.api._tune import tune_model
from autotune.records import (
    AutotuneError,
    Machine,
    ProfileRecord,
    Recommendation,
    TuneOptions,
    read_record,
)
from autotune.search import TrialRunner


def recommend(
    model_file_or_callables: str | Path | Mapping[str, Callable[..., Any]] | None = None,
    *,
    global_batch: int,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    search: bool = False,
    machine: Machine | None = None,
    options: TuneOptions | None = None,
    runner: TrialRunner | None = None,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
    profile: str | Path | ProfileRecord | None = None,
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
        nproc_per_node: ranks on each node, as torchrun counts them (with ``search``,
            trials run this many processes here).
        nnodes: nodes; the plan is for ``nproc_per_node x nnodes`` ranks.
        search: ``False`` profiles once and takes the policy's plan; ``True`` runs
            real trials (``autotune tune``) and takes the measured best.
        machine: the target machine; or its fields as keywords: ``device`` (where to
            profile and run trials), ``device_memory`` (bytes, or a string such as
            ``"80GiB"``; default: the profiled GPU's, or this CPU's available memory),
            ``margin``, ``inter_gbps``.
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
        profile: a saved profile of the model (a path or the record) to plan from instead of
            a short fresh one; with ``search``, the search's profile.
        **fields: fields of :class:`Machine` and (with ``search``) of :class:`TuneOptions`.

    Returns:
        A :class:`Recommendation`; :func:`deepspeed_config` (or, for an ``engine=fsdp2``
        plan, :func:`fsdp2_config`) turns it into a ready config.

    Raises:
        AutotuneError: bad arguments, a broken model file, or a search in which
            no trial succeeded.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise AutotuneError(f"recommend: nproc_per_node and nnodes must be >= 1 "
                            f"(got {nproc_per_node}, {nnodes})")  # fmt: skip
    ranks = machine.world_size if machine is not None else nproc_per_node * nnodes
    if global_batch < 1 or global_batch % ranks:
        raise AutotuneError(
            f"recommend: global_batch {global_batch} must be a positive multiple of "
            f"nproc_per_node x nnodes = {ranks}"
        )
    if machine is None:
        fields.update(nproc_per_node=nproc_per_node, nnodes=nnodes)
    tune_fields = {f.name for f in dataclasses.fields(TuneOptions)}
    if not search and (options is not None or runner is not None or set(fields) & tune_fields):
        ignored = sorted(set(fields) & tune_fields) + ["options"] * (options is not None) + [
            "runner"] * (runner is not None)  # fmt: skip
        raise AutotuneError(f"recommend: {', '.join(ignored)} apply to search=True only")
    saved = (
        read_record(profile, ProfileRecord, "profile")
        if isinstance(profile, str | Path)
        else profile
    )
    if search and saved is not None and not isinstance(profile, str | Path):
        raise AutotuneError("recommend: with search=True give profile= as a file path")
    if search and profile is not None and options is None:
        fields["profile_path"] = str(profile)
    options, machine = tune_records(options, machine, {"global_batch": global_batch, **fields}
                                    if options is None else fields)  # fmt: skip
    if not isinstance(model_file_or_callables, Mapping):
        from autotune.runtime.hf import model_source

        with model_source(model_file_or_callables, hf_config=hf_config, hf_model=hf_model,
                          seq_len=seq_len, task=task) as source:  # fmt: skip
            if saved is None:  # a profile would run real steps of it: refused now if too large
                given = {"hf_config": hf_config, "hf_model": hf_model}
                name = next((f"{k}={v}" for k, v in given.items() if v), str(source.path))
                compose.refuse_oversized(source.path, machine.device, f"recommend: {name}")
            rec = _recommend(source.path, search, options, machine, runner, saved)
        return rec.model_copy(update={"model_file": source.label})
    with tempfile.TemporaryDirectory(prefix="autotune-hooks-") as directory:
        shim = Path(directory) / "hooks.py"
        shim.write_text(hooks_model_file(model_file_or_callables), encoding="utf-8")
        rec = _recommend(shim, search, options, machine, runner, saved)
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
               runner: TrialRunner | None, profile: ProfileRecord | None) -> Recommendation:  # fmt: skip
    if not search:
        return _recommend_by_policy(model_file, options.global_batch, machine, profile)
    record = tune_model(str(model_file), options=options, machine=machine, runner=runner)
    if record.recommendation is None:
        raise AutotuneError(
            f"recommend: no trial of {model_file} succeeded, so nothing to recommend"
        )
    return record.recommendation


def _recommend_by_policy(
    model_file: str | Path, global_batch: int, machine: Machine, saved: ProfileRecord | None
) -> Recommendation:
    if saved is not None:
        record = compose.completed(saved, model_file)
    else:  # the short profiles `autotune tune` takes, at a small share of the per-rank batch
        record = compose.short_profiles(
            model_file, global_batch // machine.world_size, machine.device
        )
    composition = compose.compose(record, machine=machine, global_batch=global_batch)
    plan = composition.policy
    assert plan is not None
    estimate = composition.estimate(plan)
    return Recommendation(
        source="suggest",
        plan=plan,
        model_file=str(model_file),
        code_changes=composition.code_changes(plan),
        notes=["from one profile and the policy's rules; not confirmed by trials (search=True is)"],
        capabilities=record.environment.capabilities,
        parameters=record.model.parameters,
        predicted_peak_bytes=estimate.memory.peak,
        predicted_fits=estimate.fits,
        predicted_step_seconds=estimate.predicted_step_seconds,
        predicted_step_seconds_interval=estimate.predicted_step_seconds_interval,
    )
