"""Search efficiency: exhaustive grid vs ``tune`` at 10/25/50 % of the grid's trials.

Usage: OMP_NUM_THREADS=1 python bench/search_efficiency.py examples/tiny_llama.py \
           --global-batch 4 [--repeats 3] [--device cpu] [--device-memory BYTES]

Every plan of the grid is run, the predicted misfits too, so the table shows for each plan
the predicted peak, the measured peak and the budget. A tune trial is "wasted" when it ran
and came out over the budget (or out of memory), judged on its measured peak, not on the
prediction tune pruned with. Winners are compared by medians of interleaved repeats.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.compose import compose, short_profiles
from autotune.records import Machine, TuneOptions
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import SubprocessRunner, TrialSettings, tune
from autotune.search._outcome import classify_outcome
from autotune.search._space import make_space

MIB = 2**20


def _run(runner: Any, plan: Any, settings: Any) -> tuple[str, Any]:
    report = runner.run(plan, settings)
    outcome = classify_outcome(
        report.returncode, report.timed_out, report.result, report.stderr_tail
    )
    return outcome, report.result


def _wasted(record: Any, budget: int | None) -> int:
    """Trials that ran and were over the budget by their measured peak, or out of memory."""
    ran = [t for t in record.trials if t.outcome is not None]
    over = [t for t in ran if budget is not None and (t.peak_memory_bytes or 0) > budget]
    return len({t.number for t in over} | {t.number for t in ran if t.outcome == "oom"})


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / MIB:.2f}"


def _grid(runner: Any, plans: list[Any], settings: Any, predict: Any, budget: int | None) -> dict:
    print("| plan | predicted peak MiB | measured peak MiB | budget MiB | predicted fit | "
          "measured fit | outcome | samples/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    grid = {}
    for plan in plans:
        prediction = predict(plan)
        outcome, result = _run(runner, plan, settings)
        peak = result.peak if result else None
        fits = None if budget is None or peak is None else peak <= budget
        speed = result.samples_per_s if outcome == "ok" and result else None
        grid[plan.describe()] = (plan, speed)
        shown = "–" if speed is None else f"{speed:.2f}"
        print(f"| {plan.describe()} | {_mib(prediction.peak_bytes)} | {_mib(peak)} | {_mib(budget)} | "
              f"{prediction.fits} | {fits} | {outcome} | {shown} |", flush=True)  # fmt: skip
    return grid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device-memory", type=int, default=None)
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    profile = short_profiles(model, args.global_batch, args.device)
    blocks = profile.model.block_stack.count if profile.model.block_stack else 0
    machine = Machine(device="cpu", device_memory=args.device_memory)
    predict = compose(profile, machine=machine).prediction
    # The grid runs without the budget, so an over-budget plan is measured to the end.
    free = TrialSettings(model_file=model, steps=2, warmup=1, device=args.device, timeout_s=300)
    settings = free.model_copy(update={"device_memory": args.device_memory})
    runner = SubprocessRunner(entry_points=ENTRY_POINTS)
    plans = make_space(args.global_batch, 1, blocks, None, None).all_plans()
    start = time.monotonic()
    grid = _grid(runner, plans, free, predict, args.device_memory)
    grid_s = time.monotonic() - start
    fitting = {k: v for k, v in grid.items() if v[1] and predict(v[0]).fits is not False}
    grid_best = max(fitting.values(), key=lambda v: v[1] or 0)[0]
    winners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for share in (0.10, 0.25, 0.50):
            trials = max(1, round(share * len(plans)))
            options = TuneOptions(global_batch=args.global_batch, trials=trials, repeats=0,
                                  storage=f"{tmp}/s{share}.db")  # fmt: skip
            record = tune(model, options=options, machine=machine, settings=settings,
                          runner=runner, blocks=blocks, predict=predict)  # fmt: skip
            assert record.recommendation is not None
            ran = sum(1 for t in record.trials if t.outcome is not None)
            wasted = _wasted(record, args.device_memory)
            winners[share] = (record.recommendation.plan, trials, ran, wasted)
    contenders = [grid_best] + [w[0] for w in winners.values()]
    rounds = [[_run(runner, p, settings)[1] for p in contenders] for _ in range(args.repeats)]
    median = [
        statistics.median(r[i].samples_per_s for r in rounds if r[i] and r[i].samples_per_s)
        for i in range(len(contenders))
    ]
    print(f"\ngrid: {len(plans)} plans, all run, {grid_s:.0f} s; best that fits "
          f"{grid_best.describe()} {median[0]:.2f} samples/s (median of {args.repeats})")  # fmt: skip
    print("\n| budget | trials | ran | wasted (measured over budget or OOM) | winner "
          "| median samples/s | vs grid best |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for index, (share, (plan, trials, ran, wasted)) in enumerate(winners.items(), 1):
        print(f"| {share:.0%} | {trials} | {ran} | {wasted} | {plan.describe()} | "
              f"{median[index]:.2f} | {median[index] / median[0]:.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
