"""What every family of the Python API shares: its keyword records, the model path check and
the trials' memory guard."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.records import AutotuneError, Machine, TuneOptions

GUARD_SHARE = 0.5
"""Share of the machine's available RAM all ranks of a trial may use together."""


def default_guard(nproc: int) -> int:
    """RSS per rank above which a trial stops itself, so the machine never meets its OOM killer.

    Read after this process has handed back what its profiling freed.
    """
    import psutil

    from autotune.runtime.profiler import return_freed_memory

    return_freed_memory()
    return int(psutil.virtual_memory().available * GUARD_SHARE / nproc)


_RENAMED = {"nproc": "nproc_per_node", "gpus_per_node": "nproc_per_node", "nodes": "nnodes",
            "world_size": "nproc_per_node and nnodes"}  # fmt: skip


def tune_records(
    options: TuneOptions | None, machine: Machine | None, fields: Mapping[str, Any]
) -> tuple[TuneOptions, Machine]:
    """The run's two records: those given, or built from keyword ``fields`` named as their
    fields; an old spelling of the rank count is refused with its new name.

    Raises:
        AutotuneError: a keyword neither record has, or one given beside its record.
    """
    names = {"options": {f.name for f in dataclasses.fields(TuneOptions)},
             "machine": {f.name for f in dataclasses.fields(Machine)}}  # fmt: skip
    given: dict[str, dict[str, Any]] = {"options": {}, "machine": {}}
    for key, value in fields.items():
        if key in _RENAMED:
            raise AutotuneError(f"tune: {key}: renamed to {_RENAMED[key]}")
        name = key
        owner = next((kind for kind, known in names.items() if name in known), None)
        if owner is None:
            raise AutotuneError(
                f"tune: unknown option {key!r} (not a field of TuneOptions or Machine)"
            )
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
