"""Search efficiency: exhaustive grid vs ``tune`` at 10/25/50 % of the grid's trials.

Usage: OMP_NUM_THREADS=1 python bench/search_efficiency.py examples/mlp_dataloader.py \
           --global-batch 4 [--repeats 3] [--device cpu]

Winners are compared by medians of interleaved repeats, not by their search-time numbers.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from autotune.api import load_profile, make_predict
from autotune.search import SubprocessRunner, TrialSettings, classify_outcome, make_space, tune


def _measure(runner, plan, settings) -> float | None:
    report = runner.run(plan, settings)
    ok = (
        classify_outcome(report.returncode, report.timed_out, report.result, report.stderr_tail)
        == "ok"
    )
    return report.result.samples_per_s if ok and report.result else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--device-memory", type=int, default=None)
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    profile = load_profile(model, None, args.global_batch, args.device)
    blocks = profile.model.block_stack.count if profile.model.block_stack else 0
    predict = make_predict(profile, args.device_memory)
    settings = TrialSettings(model_file=model, steps=2, warmup=1, device=args.device, timeout_s=300,
                             device_memory=args.device_memory)  # fmt: skip
    runner = SubprocessRunner()
    space = make_space(args.global_batch, 1, blocks, None, None)
    plans = space.all_plans()
    start = time.monotonic()
    misfits = [p for p in plans if not predict(p).fits]
    grid = {p.describe(): (p, _measure(runner, p, settings)) for p in plans if p not in misfits}
    grid_s = time.monotonic() - start
    grid_best = max((v for v in grid.values() if v[1]), key=lambda v: v[1] or 0)[0]
    winners = {}
    with tempfile.TemporaryDirectory() as tmp:
        for share in (0.10, 0.25, 0.50):
            trials = max(1, round(share * len(plans)))
            record = tune(model, global_batch=args.global_batch, settings=settings, runner=runner,
                          blocks=blocks, predict=predict, trials=trials, repeats=0,
                          storage=f"{tmp}/s{share}.db")  # fmt: skip
            run_misfits = [t for t in record.trials if t.outcome and not predict(t.plan).fits]
            assert record.recommendation is not None
            winners[share] = (record.recommendation.plan, trials, len(run_misfits))
    contenders = [grid_best] + [w[0] for w in winners.values()]
    rounds = [[_measure(runner, p, settings) for p in contenders] for _ in range(args.repeats)]
    median = [statistics.median(r[i] for r in rounds if r[i]) for i in range(len(contenders))]
    print(f"grid: {len(plans)} plans, {len(misfits)} predicted misfits not run, {grid_s:.0f} s; "
          f"best {grid_best.describe()} {median[0]:.2f} samples/s (median of {args.repeats})")  # fmt: skip
    print("| budget | trials | winner | median samples/s | vs grid best | misfits run |")
    print("|---|---|---|---|---|---|")
    for index, (share, (plan, trials, bad)) in enumerate(winners.items(), 1):
        print(f"| {share:.0%} | {trials} | {plan.describe()} | {median[index]:.2f} | "
              f"{median[index] / median[0]:.1%} | {bad} |")  # fmt: skip


if __name__ == "__main__":
    main()
