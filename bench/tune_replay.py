"""`autotune tune`'s search replayed on a kept grid: how often does its pick land within 2 % of the
grid's best, with the grid's own measurements as the machine (issue 33)?

Usage: .venv/bin/python bench/tune_replay.py bench/data/grid_124m_amx.json [MODEL] \\
           [--nproc-per-node 2] [--global-batch 8] [--budget 3GiB] [--trials 6] [--seeds 20] \\
           [--spread 0.055] [--engines deepspeed,fsdp2] [--profiles FILE]

The search is :func:`autotune.search.tune` as `autotune tune` calls it: the policy, the estimate
composed from tune's own two short profiles of MODEL (kept in FILE, by default the grid file's
``.tune-profiles.json``; taken here, about 25 s, and kept where missing), its link swept by the
first trial (the grid's own, engine costs included), the predicted front, the neighbours, the
final comparison. Only the trials are replayed: each plan's run takes the grid's median seconds
per step (an attention change takes its plan's: the grid ran the model's code) times a draw of
the run-to-run spread (lognormal, median distance from 1 ``--spread``), its peak the grid's
measured one, and a plan the grid did not run (predicted far over the budget) runs out of memory.
A replayed run reports the duration a real one would have (start-up plus its steps), so the
final comparison's 30 % cap on re-runs holds as in a real tune.

Each seed is one tune. Printed: each tune's pick, its grid samples/s over the grid's best plan
that fits (peak within the budget), the plans it ran; then how many picks land within 2 %. This
tests the search's design on measurements, not the machine: the grid's single rounds carry
their own noise (an interleaved A/B decides between close plans; bench/tune_quality.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "examples" / "gpt2_small.py"
NEAR = 0.02
"""A pick within this share of the grid's best counts as reaching it (issue 33)."""
STARTUP_S = 3.0
"""Seconds a replayed run pays before its first step (a live worker group's, measured 2-6 s)."""
STEPS = 3
"""Measured steps of a replayed run, after one warm-up step (a 124M trial measures 2-3)."""
WITHIN_RUN = 0.02
"""Spread of one run's steps around the run's own level (its median step time's interval)."""


def _refuse(message: str) -> None:
    print(f"autotune: {message}", file=sys.stderr)
    raise SystemExit(2)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path, help="a grid file kept by bench/grid_124m.py")
    parser.add_argument("model", nargs="?", default=str(MODEL))
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--budget", default="3GiB", help="per-rank memory budget")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--spread", type=float, default=0.055,
                        help="median distance of a run from its plan's level (RUN_SPREAD)")  # fmt: skip
    parser.add_argument("--engines", help="tune's --engines (default: tune's own default)")
    parser.add_argument("--profiles", type=Path,
                        help="tune's two short profiles (default: GRID's .tune-profiles.json)")  # fmt: skip
    args = parser.parse_args()
    from autotune.records import AutotuneError, parse_bytes

    try:
        args.budget_bytes = parse_bytes(args.budget, "--budget")
    except AutotuneError as error:
        _refuse(str(error))
    if not args.grid.is_file():
        _refuse(f"{args.grid}: no such grid file")
    if not Path(args.model).is_file():
        _refuse(f"{args.model}: no such model file")
    if args.seeds < 1 or args.trials < 1 or not 0 < args.spread < 1:
        _refuse("--seeds and --trials: at least 1; --spread: a share in (0, 1)")
    if args.global_batch % args.nproc_per_node:
        _refuse(f"--global-batch {args.global_batch}: not a multiple of {args.nproc_per_node} ranks")  # fmt: skip
    return args


class Grid:
    """A grid file's entry for one model: each plan's median seconds per step and largest peak."""

    def __init__(self, entry: dict[str, Any]) -> None:
        from autotune.records import LinkMeasure, Plan

        self.seconds = {Plan.model_validate_json(k): statistics.median(v)
                        for k, v in entry["seconds"].items() if v}  # fmt: skip
        self.peaks = {Plan.model_validate_json(k): max(v) for k, v in entry["peaks"].items() if v}
        self.link = LinkMeasure.model_validate(entry["link"])

    def truth(self, plan: Any) -> Any:
        """The grid's plan ``plan`` runs as: the same with the model's code as written."""
        return plan.with_changes(attention="default", compile=False)

    def rate(self, plan: Any) -> float | None:
        """The grid's samples/s of ``plan`` (``None``: not run there)."""
        seconds = self.seconds.get(self.truth(plan))
        return plan.global_batch / seconds if seconds else None

    def best(self, budget: int) -> tuple[Any, float]:
        """The fastest plan whose measured peak is within ``budget``, and its samples/s."""
        fitting = [p for p in self.seconds if self.peaks.get(p, budget + 1) <= budget]
        top = max(fitting, key=lambda p: self.rate(p) or 0.0)
        return top, self.rate(top) or 0.0


def _load(args: argparse.Namespace) -> tuple[Grid, Any]:
    """The grid's entry for MODEL and tune's two short profiles of it (taken and kept if missing)."""
    from step_time import kept_tune_profiles

    sha = hashlib.sha256(Path(args.model).read_bytes()).hexdigest()
    kept = json.loads(args.grid.read_text())
    if sha not in kept or not kept[sha].get("seconds"):
        _refuse(f"{args.grid}: no measurements of {args.model} (sha256 {sha[:12]})")
    if kept[sha].get("link") is None:
        _refuse(f"{args.grid}: no link kept beside the measurements")
    per_rank = args.global_batch // args.nproc_per_node
    path = args.profiles or args.grid.with_suffix(".tune-profiles.json")
    if args.profiles:
        profiles = json.loads(path.read_text()) if path.exists() else {}
        if profiles.get("model_sha256") != sha or profiles.get("per_rank") != per_rank:
            _refuse(f"--profiles {path}: not {args.model}'s at per-rank batch {per_rank}")
    profile = kept_tune_profiles(path, args.model, sha, per_rank)
    print(f"grid: {args.grid} ({len(kept[sha]['seconds'])} plans)")
    return Grid(kept[sha]), profile


def replay_runner(grid: Grid, budget: int, sigma: float, rng: random.Random) -> Any:
    """A runner whose runs take the grid's measurements, each times a draw of the spread."""
    from autotune.records import TrialResult
    from autotune.search._records import RunReport
    from autotune.search._runner import FakeRunner

    class Replay(FakeRunner):
        def run(self, plan: Any, settings: Any) -> RunReport:
            self.plans.append(plan)
            truth = grid.truth(plan)
            seconds = grid.seconds.get(truth)
            if seconds is None:
                tail = "torch.OutOfMemoryError: CPU out of memory (not run in the grid)"
                return RunReport(returncode=1, timed_out=False, result=None, stderr_tail=tail,
                                 duration_s=STARTUP_S)  # fmt: skip
            level = seconds * math.exp(rng.gauss(0.0, sigma))
            steps = sorted(level * math.exp(rng.gauss(0.0, WITHIN_RUN)) for _ in range(STEPS))
            median = statistics.median(steps)
            result = TrialResult(
                completed_steps=STEPS + 1, samples_per_s=plan.global_batch / median,
                step_time=median, step_times=steps, step_interval=(steps[0], steps[-1]),
                peak_memory_bytes=[grid.peaks.get(truth, 0)], peak_source="grid",
                device_memory=budget, reused=True, first_step_at=None, link=grid.link,
            )  # fmt: skip
            duration = STARTUP_S + (STEPS + 1) * level
            return RunReport(returncode=0, timed_out=False, result=result, duration_s=duration,
                             fixed_s=STARTUP_S)  # fmt: skip

    return Replay(lambda plan, settings: "crash")


def replay(args: argparse.Namespace, grid: Grid, record: Any, seed: int) -> Any:
    """One tune of the grid's model, its trials replayed (seed ``seed``)."""
    from autotune import compose
    from autotune.records import Machine, TuneOptions
    from autotune.search import trial_settings, tune

    given = Machine(nproc_per_node=args.nproc_per_node, device="cpu",
                    device_memory=args.budget_bytes)  # fmt: skip
    composition = compose.compose(record, machine=given, global_batch=args.global_batch)
    machine = composition.machine
    assert composition.policy is not None
    rng = random.Random(seed)
    runner = replay_runner(grid, args.budget_bytes, args.spread / 0.6745, rng)
    with tempfile.TemporaryDirectory() as tmp:
        engines = tuple(args.engines.split(",")) if args.engines else None
        options = TuneOptions(global_batch=args.global_batch, trials=args.trials,
                              storage=f"{tmp}/study.db", seed=seed, engines=engines)  # fmt: skip
        settings = trial_settings(args.model, options, machine)
        stack = record.model.block_stack
        tuned = tune(
            args.model, options=options, machine=machine, settings=settings, runner=runner,
            blocks=stack.count if stack else 0, policy=composition.policy,
            predict=composition.prediction,
            relink=lambda link: composition.on_link(link).prediction,
        )  # fmt: skip
    return tuned, runner.plans


def main() -> None:
    args = _arguments()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    grid, record = _load(args)
    top, top_rate = grid.best(args.budget_bytes)
    print(f"grid's best that fits {args.budget}: {top.describe()}, {top_rate:.3f} samples/s")
    print(f"{args.seeds} tunes, --trials {args.trials}, run-to-run spread {args.spread:.1%} "
          f"(median distance), {STEPS} steps a run\n")  # fmt: skip
    print("| seed | pick | pick's grid samples/s / best's | runs (search + re-runs) | plans run |")
    print("|---|---|---|---|---|")
    ratios, found = [], 0
    for seed in range(args.seeds):
        tuned, ran = replay(args, grid, record, seed)
        rec = tuned.recommendation
        rate = grid.rate(rec.plan) if rec is not None else None
        ratio = (rate or 0.0) / top_rate
        ratios.append(ratio)
        distinct = list(dict.fromkeys(grid.truth(p) for p in ran))
        found += top in distinct
        print(f"| {seed} | {rec.plan.describe() if rec else '–'} | {ratio:.3f} | {len(ran)} | "
              f"{'; '.join(p.describe() for p in distinct)} |")  # fmt: skip
    near = sum(1 for r in ratios if r >= 1 - NEAR)
    ratios.sort()
    print(f"\nthe grid's best plan measured by the search in {found} of {args.seeds} tunes; picks "
          f"within {NEAR:.0%} of it: {near}; pick / best: median {statistics.median(ratios):.3f}, "
          f"lowest {ratios[0]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
