"""``search.tune`` called the way the search tests describe a run: its options and machine
as keywords, built into the records the composer passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.records import LinkMeasure, Machine, Plan, TuneOptions
from autotune.search import (
    Predict,
    Progress,
    TrialResult,
    TrialRunner,
    TrialSettings,
    TuneRecord,
    tune,
)
from autotune.search._runner import FakeRunner

GiB = 2**30


class FakePool(FakeRunner):
    """Stands in for the composer's pooled runner (patch ``autotune.api._tune.PoolRunner``): every
    trial 'runs' at once, fits in 1 GiB, and is faster at smaller micro-batches."""

    def __init__(self, **_: Any) -> None:
        super().__init__(self._ok)

    @staticmethod
    def _ok(plan: Plan, settings: TrialSettings) -> TrialResult:
        return TrialResult(completed_steps=2, samples_per_s=8.0 / plan.micro_batch,
                           step_time=1.0, peak_memory_bytes=[GiB], peak_source="fake",
                           device_memory=settings.device_memory)  # fmt: skip

    def __enter__(self) -> FakePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def run_tune(
    model_file: str,
    *,
    runner: TrialRunner,
    settings: TrialSettings | None = None,
    nproc: int = 1,
    nnodes: int = 1,
    blocks: int = 0,
    policy: Plan | None = None,
    predict: Predict | None = None,
    relink: Callable[[LinkMeasure], Predict] | None = None,
    code_changes: Callable[[Plan], list[Any]] | None = None,
    progress: Callable[[Progress], None] | None = None,
    **options: Any,
) -> TuneRecord:
    """:func:`autotune.search.tune` with ``TuneOptions(**options)`` on ``nproc`` x ``nnodes``."""
    return tune(
        model_file,
        options=TuneOptions(**options),
        machine=Machine(nproc_per_node=nproc, nnodes=nnodes),
        settings=settings or TrialSettings(model_file=model_file),
        runner=runner,
        blocks=blocks,
        policy=policy,
        predict=predict,
        relink=relink,
        code_changes=code_changes,
        progress=progress,
    )
