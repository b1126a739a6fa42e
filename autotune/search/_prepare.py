"""``tune_model()``: profile (or read a profile), ask the policy and the estimate, then ``tune()``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune._errors import AutotuneError
from autotune.plan import Plan
from autotune.records import ProfileRecord
from autotune.search._records import TrialSettings, TuneRecord
from autotune.search._runner import SubprocessRunner, TrialRunner
from autotune.search._space import Predict, Prediction
from autotune.search._tune import Progress, tune
from autotune.units import format_bytes

GUARD_SHARE = 0.5
"""Share of the machine's available RAM all ranks of a trial may use together."""


def load_profile(
    model_path: str, profile_path: str | None, per_rank: int, device: str
) -> ProfileRecord:
    """The saved profile, or a short fresh one (2 measured steps at micro-batch <= 2)."""
    if profile_path is not None:
        from autotune._io import read_record

        return read_record(profile_path, ProfileRecord, "profile")
    from autotune.runtime.profiler import profile

    return profile(model_path, batch_size=min(2, per_rank), steps=2, warmup=1, device=device)


def make_predict(profile: ProfileRecord, device_memory: int | None) -> Predict:
    """The estimate as a ``plan -> Prediction`` function (pure once the facts are read)."""
    from autotune._estimate import estimate_plan
    from autotune.modelfacts import facts_from_profile

    facts = facts_from_profile(profile)

    def predict(plan: Plan) -> Prediction:
        estimate = estimate_plan(facts, plan, device_memory=device_memory)
        peak = estimate.memory.peak
        if estimate.fits is not False:
            return Prediction(True, peak, estimate.source)
        reason = f"peak {format_bytes(peak)} > usable part of {format_bytes(device_memory)} ({estimate.source})"
        return Prediction(False, peak, estimate.source, reason)

    return predict


def default_guard(nproc: int) -> int:
    """RSS per rank above which a trial stops itself, so the machine never meets its OOM killer."""
    import psutil

    return int(psutil.virtual_memory().available * GUARD_SHARE / nproc)


def tune_model(
    model_path: str,
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
    trial_timeout: float = 600.0,
    runner: TrialRunner | None = None,
    progress: Callable[[Progress], None] | None = None,
    **options: Any,
) -> TuneRecord:
    """Everything ``autotune tune`` does before and around :func:`tune`.

    Reads or takes a short profile, asks the policy for its plan and the estimate
    for every plan's fit, then searches with real trials. ``options`` go to
    :func:`tune` (trials, budget_s, storage, study_name, repeats).
    """
    if not Path(model_path).is_file():
        raise AutotuneError(f"{model_path}: no such model file")
    if global_batch < 1 or nproc < 1 or global_batch % nproc:
        raise AutotuneError(f"--global-batch {global_batch} does not split over --nproc {nproc}")
    record = load_profile(model_path, profile_path, global_batch // nproc, device)
    if device_memory is None and record.environment.device_type == "cuda":
        device_memory = record.environment.device_memory_bytes
    from autotune._recommend import code_changes_for
    from autotune._suggest import policy_plan

    policy = policy_plan(record, device_memory=device_memory, world_size=nproc,
                         global_batch=global_batch, policy_path=policy_path)  # fmt: skip
    stack = record.model.block_stack
    settings = TrialSettings(
        model_file=str(Path(model_path).resolve()), steps=steps, warmup=warmup, device=device,
        device_memory=device_memory, memory_guard=default_guard(nproc), timeout_s=trial_timeout,
    )  # fmt: skip

    def changes(plan: Plan) -> list[Any]:
        return code_changes_for(plan, block_stack_path=stack.path if stack else None,
                                num_blocks=stack.count if stack else None)  # fmt: skip

    tuned = tune(
        settings.model_file, global_batch=global_batch, settings=settings,
        runner=runner or SubprocessRunner(), nproc=nproc, blocks=stack.count if stack else 0,
        policy=policy, baseline=baseline, predict=make_predict(record, device_memory),
        code_changes=changes, progress=progress, **options,
    )  # fmt: skip
    if tuned.recommendation is None:
        return tuned
    # The trials sized ZeRO's buckets to the model; the emitted config must do the same.
    rec = tuned.recommendation.model_copy(update={"parameters": record.model.parameters})
    return tuned.model_copy(update={"recommendation": rec})
