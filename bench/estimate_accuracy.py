"""How close are `autotune estimate`'s predictions to measurement on this machine?

Profiles every plan of a grid of micro-batch (B/2, B, 2B) x checkpointing (0, L)
x precision per example model. Peak memory of every plan is predicted twice: from
the model file alone (a whole training step traced on fake tensors, no profile),
and from the one fp32 profile at B without checkpointing (activations of other
precisions traced); that profiled plan is an input of the second prediction, not
a prediction, and is marked so. Step-time ratios (to the same precision at B) are
predicted from three plans of that precision: B, B/2 (fixed vs per-sample time)
and B with all blocks checkpointed (recompute cost), their profiles' phase times
replaced by medians of the interleaved repeats; the other three plans are
predictions, compared with the medians of interleaved repeats (TrainRunner
steps, plans taken in turn each round) with their [min, max] over rounds.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/estimate_accuracy.py [--rounds 5]
Goal (issue 3): peak within 5 %, step-time ratios within 15 %.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from typing import Any  # noqa: E402

from autotune.estimator import estimate_plan, facts_from_profile, fit_step_time
from autotune.records import Plan
from autotune.runtime._step import TrainRunner  # noqa: E402
from autotune.runtime.modelfile import load_model_file  # noqa: E402
from autotune.runtime.profiler import profile  # noqa: E402
from autotune.runtime.trace import facts_from_model_file  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELS = {"tiny_llama": 4, "mlp_dataloader": 64, "slow_input": 16}
AUTOCAST = {"fp32": "fp32", "amp_bf16": "bf16"}


def _profile(path: Path, plan: Plan, layers: int) -> object:
    return profile(
        path,
        batch_size=plan.micro_batch,
        steps=4,
        warmup=1,
        device="cpu",
        precision=AUTOCAST[plan.precision],  # type: ignore[arg-type]
        checkpointing=plan.checkpoint_blocks == layers and layers > 0,
    )


def _grid(base: int, layers: int, precisions: list[str]) -> list[Plan]:
    return [
        Plan.model_validate({"precision": p, "micro_batch": mb, "checkpoint_blocks": k})
        for p in precisions
        for k in sorted({0, layers})
        for mb in (max(base // 2, 1), base, 2 * base)
    ]


def _timed(path: Path, plans: list[Plan], rounds: int, steps: int) -> dict[Plan, list[Any]]:
    """Every timed step of each plan (StepTiming), plans interleaved within each round."""
    model_file = load_model_file(path)
    runners = {
        plan: TrainRunner(
            model_file,
            device="cpu",
            precision=AUTOCAST[plan.precision],  # type: ignore[arg-type]
            checkpoint_blocks=plan.checkpoint_blocks,
            micro_batch=plan.micro_batch,
        )
        for plan in plans
    }
    for runner in runners.values():
        runner.step()  # warm-up
    timings: dict[Plan, list[Any]] = {plan: [] for plan in plans}
    for _ in range(rounds):
        for plan, runner in runners.items():
            timings[plan].append([runner.step() for _ in range(steps)])
    for runner in runners.values():
        runner.close()
    return timings


def _with_interleaved_time(record: Any, rounds: list[Any]) -> Any:
    """A profile whose step time is the median of the interleaved repeats (less noise than
    the profile's own few steps, taken at another moment)."""
    steps = [timing for one_round in rounds for timing in one_round]

    def median(name: str) -> float:
        return statistics.median(getattr(t, name) for t in steps)

    time = record.time.model_copy(
        update={
            "step": median("total"),
            "dataloader": median("dataloader"),
            "forward": median("forward"),
            "backward": median("backward"),
            "optimizer": median("optimizer"),
        }
    )
    return record.model_copy(update={"time": time})


def _time_facts(profiles: dict[Plan, Any], base: Plan, layers: int, traced: Any) -> Any:
    """Time facts of one precision: the baseline profile refined by the two neighbours
    that differ in one knob (half the batch; all blocks checkpointed)."""
    facts = facts_from_profile(profiles[base]).model_copy(
        update={"block_parameters": traced.block_parameters}
    )
    facts = fit_step_time(
        facts, profiles[base.with_changes(micro_batch=max(base.micro_batch // 2, 1))]
    )
    return fit_step_time(facts, profiles[base.with_changes(checkpoint_blocks=layers)])


def bench_model(
    name: str, base_mb: int, precisions: list[str], rounds: int, steps: int
) -> list[dict]:
    path = EXAMPLES / f"{name}.py"
    traced = facts_from_model_file(path, precisions=tuple(precisions))
    layers = traced.num_layers
    base = Plan.model_validate({"precision": "fp32", "micro_batch": base_mb})
    grid = _grid(base_mb, layers, precisions)
    profiles = {plan: _profile(path, plan, layers) for plan in grid}
    # memory of every plan from the one fp32 profile (+ traced activations of other precisions)
    facts = facts_from_profile(profiles[base])
    facts = facts.model_copy(
        update={
            "activations": {**traced.activations, **facts.activations},
            "block_parameters": traced.block_parameters,
        }
    )
    timings = _timed(path, grid, rounds, steps)
    times = {plan: [statistics.median(t.total for t in r) for r in timings[plan]] for plan in grid}
    timed_profiles = {plan: _with_interleaved_time(profiles[plan], timings[plan]) for plan in grid}
    time_facts = {
        p: _time_facts(timed_profiles, base.with_changes(precision=p), layers, traced)
        for p in precisions
    }
    rows = []
    for plan in grid:
        peak = profiles[plan].memory.peak
        predicted = estimate_plan(facts, plan)
        from_file = estimate_plan(traced, plan).memory.peak
        ref = base.with_changes(precision=plan.precision)
        ratio = estimate_plan(time_facts[plan.precision], plan).predicted_step_time_ratio
        runs = [t / r for t, r in zip(times[plan], times[ref], strict=True)]
        calibrated = plan.micro_batch == base_mb or plan == ref.with_changes(
            micro_batch=max(base_mb // 2, 1)
        )
        rows.append(
            {
                "model": name,
                "plan": f"{plan.precision} mb={plan.micro_batch} ckpt={plan.checkpoint_blocks}/{layers}"
                + (" (peak: profiled input)" if plan == base else "")
                + (" (time: measured input)" if calibrated and plan != ref else ""),
                "traced_peak": from_file,
                "traced_err": from_file / peak - 1,
                "peak_input": plan == base,
                "pred_peak": predicted.memory.peak,
                "peak": peak,
                "peak_err": predicted.memory.peak / peak - 1,
                "pred_ratio": ratio,
                "ratio": statistics.median(runs),
                "ratio_lo": min(runs),
                "ratio_hi": max(runs),
                "step_s": statistics.median(times[plan]),
                "predicted": not calibrated,
            }
        )
        rows[-1]["ratio_err"] = (ratio / rows[-1]["ratio"] - 1) if ratio else None
        print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    ratio_err = "–" if row["ratio_err"] is None else f"{100 * row['ratio_err']:+.1f}%"
    return (
        f"| {row['model']} | {row['plan']} | {row['traced_peak'] / 2**20:.2f} "
        f"| {100 * row['traced_err']:+.1f}% | {row['pred_peak'] / 2**20:.2f} | {row['peak'] / 2**20:.2f} "
        f"| {100 * row['peak_err']:+.1f}% | {row['pred_ratio']:.2f} | {row['ratio']:.2f} "
        f"[{row['ratio_lo']:.2f}, {row['ratio_hi']:.2f}] | {ratio_err} | {row['step_s']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--precisions", nargs="*", default=["fp32", "amp_bf16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    started = time.time()
    print(
        "| model | plan | peak from the model file alone MiB | its error | peak from the profile MiB "
        "| measured peak MiB | its error | predicted time ratio "
        "| measured ratio [min, max over rounds] | ratio error | median step s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.models:
        rows += bench_model(name, MODELS[name], args.precisions, args.rounds, args.steps)
    worst_traced = max(rows, key=lambda r: abs(r["traced_err"]))
    predicted_peaks = [r for r in rows if not r["peak_input"]]
    worst_peak = max(predicted_peaks, key=lambda r: abs(r["peak_err"]))
    timed = [r for r in rows if r["ratio_err"] is not None and r["predicted"]]
    inputs = [
        r for r in rows if r["ratio_err"] is not None and not r["predicted"] and r["ratio_err"]
    ]
    worst_ratio = max(timed, key=lambda r: abs(r["ratio_err"]))
    print(
        f"\nworst peak error from the model file alone, every plan: "
        f"{100 * worst_traced['traced_err']:+.1f}% ({worst_traced['model']} {worst_traced['plan']})"
    )
    print(
        f"worst peak error from the profile, {len(predicted_peaks)} predicted plans "
        f"(profiled inputs left out): {100 * worst_peak['peak_err']:+.1f}% "
        f"({worst_peak['model']} {worst_peak['plan']})"
    )
    print(
        f"worst ratio error, {len(timed)} predicted plans: {100 * worst_ratio['ratio_err']:+.1f}% "
        f"({worst_ratio['model']} {worst_ratio['plan']})"
    )
    shown = ", ".join(f"{100 * r['ratio_err']:+.1f}%" for r in inputs)
    print(f"time-input rows (not predictions; their ratio is measured noise): {shown or 'none'}")
    print(f"{len(rows)} plans in {time.time() - started:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
