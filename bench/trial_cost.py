"""Per-trial fixed cost (request to first step) and step cost: a fresh launch per trial vs a live
worker group reused across trials of one rank count; and whether reuse changes what is measured.

Usage: OMP_NUM_THREADS=1 python bench/trial_cost.py examples/tiny_gpt.py --nproc-per-node 2 \
           --global-batch 32 [--rounds 4] [--steps 5]

Each round runs one plan fresh (``SubprocessRunner``: a new torchrun, as `autotune tune` did
before) and the same plan in the live group (``PoolRunner``), in alternating order; the plan
changes from round to round (ZeRO stages 0-2 and 3). Prints medians with [min, max] over the
rounds and the peaks of both per plan. Then ``--same-rounds`` paired rounds of one plan
(ZeRO-2) give the reused/fresh ratio of median step times with its 90 % interval.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from autotune.records import Plan, median_interval
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.search import PoolRunner, SubprocessRunner, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._records import RunReport


def _ok(report: RunReport) -> bool:
    result = report.result
    return (
        result is not None
        and classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail)
        == "ok"
    )


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--same-rounds", type=int, default=5)
    args = parser.parse_args()
    model = str(Path(args.model).resolve())
    per_rank = args.global_batch // args.nproc_per_node
    stages = [0, 1, 2, 3] if args.nproc_per_node > 1 else [0]
    plans = [Plan(micro_batch=per_rank // 2, grad_accum=2, nproc_per_node=args.nproc_per_node,
                  zero_stage=stages[i % len(stages)]) for i in range(args.rounds)]  # fmt: skip
    settings = TrialSettings(model_file=model, steps=args.steps, warmup=1, device="cpu",
                             timeout_s=900)  # fmt: skip
    print(f"load average (1/5/15 min) at start: {_load()} on {os.cpu_count()} cores")
    started = time.monotonic()
    same = [plans[0].with_changes(zero_stage=stages[min(2, len(stages) - 1)])] * args.same_rounds
    with (
        tempfile.TemporaryDirectory() as tmp,
        PoolRunner(entry_points=ENTRY_POINTS, workdir=Path(tmp, "pool")) as pool,
    ):
        fresh = SubprocessRunner(entry_points=ENTRY_POINTS, workdir=Path(tmp, "fresh"))
        warm = pool.warm_up(plans[:1], settings)
        rows = _rounds(fresh, pool, plans, settings)
        repeated = _rounds(fresh, pool, same, settings)
    print(f"load average at end: {_load()}; {time.monotonic() - started:.0f} s in all; "
          f"live group started once before the rounds: {warm:.1f} s")  # fmt: skip
    _print(rows, plans)
    _print_same(repeated, same[0])


def _rounds(fresh: SubprocessRunner, pool: PoolRunner, plans: list[Plan],
            settings: TrialSettings) -> dict[str, list[RunReport]]:  # fmt: skip
    """Each plan fresh and reused, which goes first alternating."""
    rows: dict[str, list[RunReport]] = {"fresh": [], "reused": []}
    for index, plan in enumerate(plans):
        order = [("fresh", fresh), ("reused", pool)]
        for name, runner in order if index % 2 == 0 else order[::-1]:
            report = runner.run(plan, settings)
            assert _ok(report), report.stderr_tail[-3000:]
            rows[name].append(report)
    return rows


def _print_same(rows: dict[str, list[RunReport]], plan: Plan) -> None:
    times = {name: [r.result.step_time or 0.0 for r in reports if r.result]
             for name, reports in rows.items()}  # fmt: skip
    ratios = [b / a for a, b in zip(times["fresh"], times["reused"], strict=True)]
    low, high = median_interval(ratios)
    print(f"\nsame plan ({plan.describe()}), {len(ratios)} paired rounds: median step time "
          f"fresh {_spread(times['fresh'])} s, reused {_spread(times['reused'])} s; "
          f"reused / fresh {statistics.median(ratios):.2f} [{low:.2f}, {high:.2f}] (90 % interval)")  # fmt: skip
    peaks = {name: {tuple(r.result.peak_memory_bytes) for r in reports if r.result}
             for name, reports in rows.items()}  # fmt: skip
    print(f"peaks per rank: fresh {sorted(peaks['fresh'])}, reused {sorted(peaks['reused'])}")


def _print(rows: dict[str, list[RunReport]], plans: list[Plan]) -> None:
    print("\n| trial | fixed cost s (request -> first step) | steps s | wall s per trial |")
    print("|---|---|---|---|")
    for name, reports in rows.items():
        fixed = [r.fixed_s or 0.0 for r in reports]
        steps = [(r.result.steps_s or 0.0) if r.result else 0.0 for r in reports]
        wall = [r.duration_s for r in reports]
        print(f"| {name} | {_spread(fixed)} | {_spread(steps)} | {_spread(wall)} |")
    ratios = [a.fixed_s / b.fixed_s for a, b in zip(rows["fresh"], rows["reused"], strict=True)
              if a.fixed_s and b.fixed_s]  # fmt: skip
    low, high = median_interval(ratios)
    print(f"\nfixed cost fresh / reused, paired by round: {statistics.median(ratios):.1f}x "
          f"[{low:.1f}, {high:.1f}]")  # fmt: skip
    print(
        "\n| plan | peak per rank, fresh | peak per rank, reused | peak diff | step time reused / fresh |"
    )
    print("|---|---|---|---|---|")
    for plan, a, b in zip(plans, rows["fresh"], rows["reused"], strict=True):
        assert a.result is not None and b.result is not None
        diff = max(abs(x - y) / y for x, y in
                   zip(b.result.peak_memory_bytes, a.result.peak_memory_bytes, strict=True))  # fmt: skip
        ratio = (b.result.step_time or 0.0) / (a.result.step_time or 1.0)
        fresh_iv, reused_iv = a.result.step_interval, b.result.step_interval
        print(f"| {plan.describe()} | {a.result.peak_memory_bytes} | {b.result.peak_memory_bytes} | "
              f"{diff:.2%} | {ratio:.2f} (fresh {a.result.step_time:.3f} s {_iv(fresh_iv)}, "
              f"reused {b.result.step_time:.3f} s {_iv(reused_iv)}) |")  # fmt: skip


def _iv(interval: tuple[float, float] | None) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""


if __name__ == "__main__":
    main()
