"""Time to answer: `autotune tune`'s wall time and trials for a small GPT-style model, and its
pick against the full grid measured once (the reference), re-measured interleaved.

Usage: OMP_NUM_THREADS=1 python bench/tune_quality.py examples/tiny_gpt.py --nproc-per-node 2 \
           --global-batch 32 --baseline-micro-batch 1 --trials 8 [--rounds 5] [--no-grid]
       ... --remeasure PICK GRID_BEST ... (only step 3, for plans printed by an earlier run)

1. ``tune_model`` as `autotune tune` runs it (two short profiles, the policy, the predicted
   front, pooled trials, the final interleaved comparison), timed end to end.
2. Every plan of the same space measured once in a live worker group (the grid).
3. The grid's three best and tune's pick re-measured ``--rounds`` times (5 steps each), the
   order rotating each round; the pick's median samples/s over the best median, with the
   range of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from autotune.api import tune_model
from autotune.records import Plan, TuneOptions, parse_plan
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import PoolRunner, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._space import SearchSpace, make_space


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _speed(pool: PoolRunner, plan: Plan, settings: TrialSettings) -> float | None:
    report = pool.run(plan, settings)
    result = report.result
    ok = classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail) == "ok"
    return result.samples_per_s if ok and result is not None else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--baseline-micro-batch", type=int, default=1)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument("--remeasure", nargs="+", default=None, metavar="PLAN",
                        help="only re-measure these plans interleaved, the first as the pick")  # fmt: skip
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    per_rank = args.global_batch // args.nproc_per_node
    baseline = Plan(micro_batch=args.baseline_micro_batch, nproc_per_node=args.nproc_per_node,
                    grad_accum=per_rank // args.baseline_micro_batch)  # fmt: skip
    print(f"load average (1/5/15 min) at start: {_load()} on {os.cpu_count()} cores")
    if args.remeasure:
        plans = [
            parse_plan(text, Plan(nproc_per_node=args.nproc_per_node)) for text in args.remeasure
        ]
        settings = TrialSettings(model_file=model, steps=5, warmup=1, device="cpu", timeout_s=900)
        with (
            tempfile.TemporaryDirectory() as tmp,
            PoolRunner(entry_points=ENTRY_POINTS, workdir=Path(tmp)) as pool,
        ):
            remeasure(pool, settings, plans[0], plans[1:], args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        record = tune_model(model, global_batch=args.global_batch, nproc_per_node=args.nproc_per_node, device="cpu",
                            baseline=baseline, trials=args.trials, storage=f"{tmp}/tune.db")  # fmt: skip
        wall = time.monotonic() - start
        _print_tune(record, wall)
        if args.no_grid or record.recommendation is None:
            return
        pick = record.recommendation.plan
        with PoolRunner(entry_points=ENTRY_POINTS, workdir=Path(tmp, "grid")) as pool:
            _grid_and_compare(pool, model, args, pick, _blocks(model))
    print(f"load average at end: {_load()}")


def _blocks(model: str) -> int:
    """L, the blocks of the model's stack (the checkpointing knob's range)."""
    from autotune.runtime._blocks import find_block_stack
    from autotune.runtime.modelfile import load_model_file

    found = find_block_stack(load_model_file(model).build_model())
    return len(found[1]) if found else 0


def _print_tune(record: object, wall: float) -> None:
    trials = getattr(record, "trials", [])
    measured = [t for t in trials if t.outcome is not None]
    skipped = [t for t in trials if t.outcome is None and t.state == "pruned"]
    rec = getattr(record, "recommendation", None)
    print(f"tune: {wall:.0f} s wall, {len(measured)} trials measured, {len(skipped)} plans "
          f"skipped unrun (predicted misfit, slower, or repeated)")  # fmt: skip
    phases = getattr(record, "wall_time", None)
    if phases is not None:
        print(f"tune's own breakdown: {phases.describe()}")
    print("| # | role | plan | outcome | samples/s | start-up s | steps s (n) | reason |")
    print("|---|---|---|---|---|---|---|---|")
    for t in trials:
        speed = f"{t.samples_per_s:.1f}" if t.samples_per_s else "-"
        fixed = f"{t.fixed_s:.1f}{'*' if t.reused_worker else ''}" if t.fixed_s is not None else "-"
        steps = f"{t.steps_s:.1f} ({t.steps_measured})" if t.steps_s is not None else "-"
        print(f"| {t.number} | {t.role} | {t.plan.describe()} | {t.outcome or t.state} | {speed} | "
              f"{fixed} | {steps} | {(t.reason or '')[:90]} |")  # fmt: skip
    if rec is not None and rec.speedup is not None:
        low, high = rec.speedup_interval or (0.0, 0.0)
        print(
            f"pick: {rec.plan.describe()}, {rec.speedup:.2f}x the baseline [{low:.2f}, {high:.2f}]"
        )
    for note in getattr(record, "notes", []):
        print(f"note: {note}")


def grid_space(global_batch: int, nproc: int, blocks: int, pick: Plan) -> SearchSpace:
    """The grid's space: tune's space around the pick, fp32 and bf16 both, whichever the pick
    has (until stop 58 a pick in fp32 got a grid of fp32 plans only, 100 on tiny Llama, and a
    bf16 pick one of both, 200), and both engines, as a model file's tune searches them by
    default (until stop 60 DeepSpeed's only). The pick's other knobs (its attention) hold for
    every plan."""
    other = Plan(precision="fp32" if pick.precision != "fp32" else "bf16")
    engines = TuneOptions(global_batch=global_batch).searched_engines()
    return make_space(global_batch, nproc, blocks, pick, other, engines=engines)


def _grid_and_compare(pool: PoolRunner, model: str, args: argparse.Namespace, pick: Plan,
                      blocks: int) -> None:  # fmt: skip
    # The grid: each plan once, 3 measured steps after 1 warm-up (the reference, not the search).
    settings = TrialSettings(model_file=model, steps=3, warmup=1, device="cpu", timeout_s=900)
    again = settings.model_copy(update={"steps": 5})
    space = grid_space(args.global_batch, args.nproc_per_node, blocks, pick)
    start = time.monotonic()
    pool.warm_up(space.all_plans()[:1], settings)
    grid = {plan: _speed(pool, plan, settings) for plan in space.all_plans()}
    done = {plan: speed for plan, speed in grid.items() if speed}
    print(f"\ngrid: {len(grid)} plans measured once in {time.monotonic() - start:.0f} s "
          f"({len(grid) - len(done)} failed)")  # fmt: skip
    top = sorted(done, key=lambda p: -done[p])[:3]
    for plan in top:
        print(f"  grid top: {plan.describe()}: {done[plan]:.1f} samples/s (one run)")
    remeasure(pool, again, pick, top, args.rounds)


def remeasure(pool: PoolRunner, settings: TrialSettings, pick: Plan, top: list[Plan],
              rounds: int) -> None:  # fmt: skip
    """The grid's best plans and tune's pick, interleaved (the order rotating each round)."""
    contenders = [pick] + [plan for plan in top if plan != pick]
    table = []
    for index in range(rounds):
        shift = index % len(contenders)
        speeds = {plan: _speed(pool, plan, settings)
                  for plan in contenders[shift:] + contenders[:shift]}  # fmt: skip
        table.append([speeds[plan] for plan in contenders])
    medians = [statistics.median(r[i] for r in table if r[i]) for i in range(len(contenders))]
    best = max(range(len(contenders)), key=lambda i: medians[i] if contenders[i] in top else 0)
    print(f"\nre-measured interleaved, {rounds} rounds, load {_load()}:")
    print(
        "| plan | median samples/s [min, max] | tune's pick / this plan, per round: median [min, max] |"
    )
    print("|---|---|---|")
    for i, plan in enumerate(contenders):
        values = [r[i] for r in table if r[i]]
        ratios = [r[0] / r[i] for r in table if r[0] and r[i]]
        label = " (tune's pick)" if i == 0 else (" (grid's best, re-measured)" if i == best else "")
        print(f"| {plan.describe()}{label} | {medians[i]:.3g} [{min(values):.3g}, {max(values):.3g}] "
              f"| {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] |")  # fmt: skip
    print(f"tune's pick / the grid's best: {medians[0] / medians[best]:.3f} (medians)")


if __name__ == "__main__":
    main()
