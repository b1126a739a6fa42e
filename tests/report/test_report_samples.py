"""Sample records for the report tests (no tests here): a profile, a tune run, a study."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from _profiles import activation_fit, model_info, profile_record, provenance

from autotune.confirm import ConfirmRecord, ConfirmStep, Measured
from autotune.policy import Evidence, Predicted, Suggestion, SuggestRecord
from autotune.records import (
    AtPeak,
    CodeChange,
    Compute,
    MeasuredPlan,
    ModuleBytes,
    Plan,
    ProfileRecord,
    Recommendation,
)
from autotune.search import TrialRecord, TuneRecord

if TYPE_CHECKING:
    import optuna

MiB = 2**20


def make_profile(blocks: int = 4, device_memory: int | None = 512 * MiB) -> ProfileRecord:
    """A profile of a tiny 4-block model with distinct, recognisable numbers."""
    at_peak = AtPeak(
        parameters=37 * MiB,
        gradients=21 * MiB,
        optimizer_states=74 * MiB,
        activations=55 * MiB,
        buffers=MiB,
        temporaries=3 * MiB,
    )
    modules = [ModuleBytes(module=f"model.layers.{i}", bytes=(11 + i) * MiB) for i in range(blocks)]
    return profile_record(
        model=model_info(9_700_000, blocks),
        batch_size=4,
        model_states=(37 * MiB, 37 * MiB, 74 * MiB),
        activations=55 * MiB,
        activations_by_module=modules,
        fit=activation_fit(fixed=MiB, per_sample=13.5 * MiB, block=3 * MiB, block_input=0.25 * MiB),
        at_peak=at_peak,
        step=0.2468,
        dataloader=0.0123,
        phases=(0.0712, 0.1321, 0.0234),
        spread=(0.23, 0.24, 0.2468, 0.25, 0.27),
        samples_per_s=16.21,
        tokens_per_s=2074.9,
        compute=Compute(flops_per_step=1.2e11, note="no peak FLOPs table for this CPU"),
        device_name="test CPU",
        device_memory=device_memory,
        provenance=provenance(
            model_file="examples/tiny_llama.py", created_at="2026-11-29T10:00:00Z"
        ),
    )


def make_trials() -> list[TrialRecord]:
    """Six trials covering every outcome; trials 0, 2 and 3 form the Pareto front."""

    def trial(
        number: int,
        mb: int,
        state: str,
        outcome: str | None,
        speed: float | None,
        peak: int | None,
        **extra: object,
    ) -> TrialRecord:
        return TrialRecord(
            number=number,
            plan=Plan(micro_batch=mb),
            state=state,
            outcome=outcome,
            samples_per_s=speed,
            peak_memory_bytes=peak,
            **extra,
        )  # type: ignore[arg-type]

    return [
        trial(0, 1, "complete", "ok", 9.87, 150 * MiB),
        trial(1, 2, "complete", "ok", 9.5, 230 * MiB),
        trial(2, 4, "complete", "ok", 17.43, 260 * MiB),
        trial(3, 8, "complete", "ok", 21.09, 410 * MiB),
        trial(4, 16, "failed", "oom", None, 700 * MiB, reason="measured peak above budget"),
        trial(5, 12, "failed", "timeout", None, None, reason="killed at the trial timeout"),
        trial(6, 3, "failed", "crash", None, None, reason="RuntimeError: boom"),
        trial(
            7,
            32,
            "pruned",
            None,
            None,
            None,
            predicted_peak_bytes=1400 * MiB,
            prediction_source="formula",
            reason="predicted out of memory",
        ),
    ]


def make_recommendation() -> Recommendation:
    best = MeasuredPlan(
        plan=Plan(micro_batch=8),
        samples_per_s=21.09,
        samples_per_s_interval=(20.5, 21.6),
        peak_memory_bytes=410 * MiB,
        repeats=3,
    )
    base = MeasuredPlan(plan=Plan(micro_batch=4), samples_per_s=16.2, repeats=3)
    return Recommendation(
        source="tune",
        plan=Plan(micro_batch=8),
        best=best,
        baseline=base,
        speedup=1.302,
        speedup_interval=(1.25, 1.34),
        code_changes=[CodeChange(what="raise the micro-batch to 8")],
        notes=["re-measured 3 times, interleaved"],
    )


def make_tune(storage: str = "tune.log", study: str = "tiny") -> TuneRecord:
    return TuneRecord(
        model_file="examples/tiny_llama.py",
        study=study,
        storage=storage,
        global_batch=8,
        nproc_per_node=1,
        device_memory=512 * MiB,
        objective="samples_per_s",
        trials=make_trials(),
        recommendation=make_recommendation(),
    )


def make_study(path: Path, name: str = "tiny", completed: int = 24) -> str:
    """An sqlite study as ``autotune tune`` stores it; returns its URL."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{path}"
    fill_study(optuna.create_study(study_name=name, storage=url, direction="maximize"), completed)
    return url


def fill_study(study: optuna.Study, completed: int) -> optuna.Study:
    """Add ``completed`` ok trials and one oom trial, with the user attributes tune writes."""
    import random

    from optuna.distributions import CategoricalDistribution, IntDistribution
    from optuna.trial import TrialState, create_trial

    dists = {
        "micro_batch": CategoricalDistribution([1, 2, 4, 8]),
        "checkpoint_blocks": IntDistribution(0, 4),
    }
    rng = random.Random(0)
    trials = []
    for _ in range(completed):
        mb, ckpt = rng.choice([1, 2, 4, 8]), rng.randint(0, 4)
        speed = 5.0 * mb - 0.3 * ckpt
        attrs = _attrs(
            Plan(micro_batch=mb, checkpoint_blocks=ckpt), "ok", (40 + 30 * mb - 5 * ckpt) * MiB
        )
        params = {"micro_batch": mb, "checkpoint_blocks": ckpt}
        trials.append(
            create_trial(
                params=params,
                distributions=dists,
                value=speed,
                user_attrs={**attrs, "samples_per_s": speed},
            )
        )
    oom = _attrs(Plan(micro_batch=8, checkpoint_blocks=0), "oom", 900 * MiB)
    trials.append(
        create_trial(
            params={"micro_batch": 8, "checkpoint_blocks": 0},
            distributions=dists,
            user_attrs=oom,
            state=TrialState.FAIL,
        )
    )
    study.add_trials(trials)
    return study


def _attrs(plan: Plan, outcome: str, peak: int) -> dict[str, object]:
    return {
        "plan": plan.model_dump(mode="json"),
        "role": "search",
        "outcome": outcome,
        "peak_memory_bytes": peak,
    }


def make_suggestions(budget: int = 160 * MiB) -> SuggestRecord:
    """Two stacked suggestions on the sample profile's plan, with evidence and predictions."""
    base = Plan(micro_batch=4)
    first = base.with_changes(checkpoint_blocks=2)
    second = first.with_changes(grad_accum=2)
    return SuggestRecord(
        policy="policies/default.toml",
        baseline=base,
        device_memory_bytes=budget,
        world_size=1,
        nproc_per_node=1,
        inter_gbps=None,
        global_batch=None,
        suggestions=[
            Suggestion(
                rule="checkpoint_blocks",
                change={"checkpoint_blocks": 2},
                plan=first,
                plan_text=first.describe(),
                evidence={"activation_share": Evidence(value=0.2871, source="measured")},
                predicted=Predicted(
                    peak_bytes_before=191 * MiB,
                    peak_bytes_after=157 * MiB,
                    fits_after=True,
                    step_time_ratio=1.137,
                    memory_source="formula",
                    time_source="measured",
                ),
                reason="activations dominate and the step does not fit",
            ),
            Suggestion(
                rule="grad_accum",
                change={"grad_accum": 2},
                plan=second,
                plan_text=second.describe(),
                evidence={"global_batch": Evidence(value=8, source="given")},
                predicted=Predicted(
                    peak_bytes_before=157 * MiB,
                    peak_bytes_after=157 * MiB,
                    fits_after=True,
                    step_time_ratio=2.0,
                    memory_source="formula",
                    time_source="formula",
                ),
                reason="keep the global batch",
            ),
        ],
        final_plan=second,
    )


def make_confirm(suggestions: SuggestRecord) -> ConfirmRecord:
    """A confirm session that kept the first suggestion and rejected the second."""
    first, second = suggestions.suggestions
    measured = Measured(
        repeats=5,
        steps_per_repeat=3,
        before_step_s=0.2468,
        after_step_s=0.2791,
        step_time_ratio=1.131,
        ratio_interval=(1.094, 1.172),
        loss_before=2.5,
        loss_after=2.5,
        loss_delta=0.0,
        peak_bytes_before=191 * MiB,
        peak_bytes_after=163 * MiB,
    )
    slower = measured.model_copy(
        update={"step_time_ratio": 1.987, "ratio_interval": (1.9, 2.05), "after_step_s": 0.5546}
    )
    return ConfirmRecord(
        model_file="examples/tiny_llama.py",
        device="cpu",
        baseline=suggestions.baseline,
        final_plan=first.plan,
        loss_tolerance=0.05,
        steps=[
            ConfirmStep(
                rule=first.rule,
                change=first.change,
                plan=first.plan,
                predicted=first.predicted,
                measured=measured,
                status="kept",
                why="fits now; 13% slower",
            ),
            ConfirmStep(
                rule=second.rule,
                change=second.change,
                plan=second.plan,
                predicted=second.predicted,
                measured=slower,
                status="rejected",
                why="twice the step time for the same samples/s",
            ),
        ],
    )
