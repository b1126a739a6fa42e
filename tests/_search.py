"""``search.tune`` called the way the search tests describe a run: its options and machine
as keywords, built into the records the composer passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.records import Machine, Plan, TuneOptions
from autotune.search import Predict, Progress, TrialRunner, TrialSettings, TuneRecord, tune


def run_tune(
    model_file: str,
    *,
    runner: TrialRunner,
    settings: TrialSettings | None = None,
    nproc: int = 1,
    nodes: int = 1,
    blocks: int = 0,
    policy: Plan | None = None,
    predict: Predict | None = None,
    code_changes: Callable[[Plan], list[Any]] | None = None,
    progress: Callable[[Progress], None] | None = None,
    **options: Any,
) -> TuneRecord:
    """:func:`autotune.search.tune` with ``TuneOptions(**options)`` on ``nproc`` x ``nodes``."""
    return tune(
        model_file,
        options=TuneOptions(**options),
        machine=Machine(gpus_per_node=nproc, nodes=nodes),
        settings=settings or TrialSettings(model_file=model_file),
        runner=runner,
        blocks=blocks,
        policy=policy,
        predict=predict,
        code_changes=code_changes,
        progress=progress,
    )
