"""An exhaustive reference at 124M: every plan of the grid that fits a per-rank budget, measured (issue 33).

Usage: TORCH_EXTENSIONS_DIR=~/.cache/autotune-torch-extensions DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 \\
       .venv/bin/python bench/grid_124m.py [MODEL] --measurements FILE [--nproc-per-node 2] \\
           [--global-batch 8] [--budget 3GiB] [--rounds 2] [--grid "engines=zero1 ckpt=none"] \\
           [--profile PROFILE] [--dry-run]

The grid (MODEL: examples/gpt2_small.py): DeepSpeed ZeRO-0 to 3 and FSDP2 stage 2 and 3 x fp32,
bf16 x no, half (``partial``) and every block checkpointed x every ga dividing global batch / ranks
(mb the rest): 108 plans at 2 ranks and global batch 8. ``--grid`` narrows any of those axes
(``zero_peaks.grid_plans``'s keys but ``mb``); the others stay whole.

Before any trial, a plan whose predicted peak (the estimate of one profile, kept beside FILE as
bench/step_time.py keeps it) is over the budget x 1.15 is dropped, and the drops are counted. The
rest are measured by ``step_time.measure``: one live worker group, ``--rounds`` interleaved
rounds, round r rotated by r, FILE written after every trial and resumed, so a plan with its
rounds there is not run again and a later commit is judged against the same grid. A plan whose
measured peak (the trial's, its largest rank, over its rounds) is over the budget does not fit and
cannot be the best. Under the table: the best plan that fits by median samples/s, its range over
the rounds, and the plans within 2 % of it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from step_time import (
    _load,
    _Parser,
    _refuse,
    check_arguments,
    exits,
    footer,
    measure,
    prepare,
    profiled_plans,
    trials_to_run,
)
from zero_peaks import REPO

MODEL = REPO / "examples" / "gpt2_small.py"
AXES = {"engines": "zero0,zero1,zero2,zero3,fsdp2-2,fsdp2-3", "precision": "fp32,bf16",
        "ckpt": "none,partial,full"}  # fmt: skip
SLACK = 1.15
"""A plan predicted over budget x SLACK is not run; the slack leaves room for the estimate's
misses, and the measured peak decides fit."""
NEAR = 0.02
"""Plans whose median samples/s is within this share of the best's are counted beside it."""


def grid_spec(per_rank: int, narrow: str | None = None) -> str:
    """The ``--grid`` text of the whole grid, ga every divisor of the samples ``per_rank`` takes
    each optimizer step, with the axes ``narrow`` names (``KEY=V1,V2 ...``) replaced.

    Raises:
        ValueError: a key that is not an axis (``mb`` included: it follows from ga), naming it.
    """
    axes = dict(AXES, ga=",".join(str(d) for d in range(1, per_rank + 1) if per_rank % d == 0))
    for item in (narrow or "").split():
        key, _, values = item.partition("=")
        if key not in axes or not values:
            raise ValueError(f"--grid {item!r}: axes are {', '.join(axes)} (KEY=V1,V2); "
                             "mb follows from ga and --global-batch")  # fmt: skip
        axes[key] = values
    return " ".join(f"{key}={values}" for key, values in axes.items())


@dataclass(frozen=True)
class Row:
    """One plan's kept measurements: seconds per step of each ok round, its largest peak."""

    plan: str
    samples: int
    """Samples one optimizer step trains, over all ranks (mb x ga x ranks)."""
    seconds: tuple[float, ...]
    peak: int | None
    """The largest rank's peak over the rounds, bytes; ``None``: not measured."""
    predicted: int
    failed: str | None = None
    """Why its last trial here did not end ok, if it did not."""

    @property
    def rate(self) -> float | None:
        """Median samples per second; ``None``: no ok round."""
        return self.samples / statistics.median(self.seconds) if self.seconds else None

    def fits(self, budget: int) -> bool | None:
        """Whether the measured peak is within ``budget``; ``None``: not measured."""
        return None if self.peak is None else self.peak <= budget


def rows(plans: list[Any], entry: dict[str, Any], predicted: dict[str, int],
         failed: dict[str, str]) -> list[Row]:  # fmt: skip
    """The rows of ``plans`` from a measurements entry and the failures ``step_time.measure``
    returned, both by plan JSON."""
    out = []
    for plan in plans:
        key = plan.model_dump_json()
        peaks = entry.get("peaks", {}).get(key)
        out.append(Row(plan=plan.describe(), samples=plan.micro_batch * plan.grad_accum * plan.world_size,
                       seconds=tuple(entry.get("seconds", {}).get(key, [])),
                       peak=max(peaks) if peaks else None, predicted=predicted[key],
                       failed=failed.get(key)))  # fmt: skip
    return out


def best(table: list[Row], budget: int) -> tuple[Row | None, list[Row]]:
    """The fastest row that fits (median samples/s), and the other fitting rows within
    ``NEAR`` of it. A row whose peak was not measured is not known to fit: it is left out."""
    fitting = [row for row in table if row.rate is not None and row.fits(budget)]
    if not fitting:
        return None, []
    top = max(fitting, key=lambda row: row.rate or 0.0)
    bar = (1 - NEAR) * (top.rate or 0.0)
    return top, [row for row in fitting if row is not top and (row.rate or 0.0) >= bar]


def _rates(row: Row) -> str:
    """Median samples/s [slowest round, fastest round]."""
    return f"{row.rate:.3f} [{row.samples / max(row.seconds):.3f}, {row.samples / min(row.seconds):.3f}]"


def print_table(table: list[Row], budget: int) -> None:
    """The table of rows, the failures, and the grid's best under it."""
    from autotune.records import format_bytes

    print("\n| plan | measured s/step: median [min, max] (rounds) | samples/s: median [min, max] "
          "| measured peak | predicted peak | fits |\n|---|---|---|---|---|---|")  # fmt: skip
    for row in table:
        fits = {None: "–", True: "yes", False: "no"}[row.fits(budget)]
        s = row.seconds
        cells = [row.plan, f"{statistics.median(s):.3f} [{min(s):.3f}, {max(s):.3f}] ({len(s)})" if s else "–",
                 _rates(row) if s else "–", format_bytes(row.peak), format_bytes(row.predicted), fits]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    unmeasured = [row for row in table if not row.seconds]
    print(f"\n{len(unmeasured)} plans without an ok measurement" + ":" * bool(unmeasured))
    print("".join(f"  {row.plan}: {row.failed or 'not run'}\n" for row in unmeasured), end="")
    over = [row.plan for row in table if row.fits(budget) is False]
    print(f"{len(over)} measured plans over the budget ({format_bytes(budget)}), not fitting: "
          f"{', '.join(over) or '–'}")  # fmt: skip
    top, near = best(table, budget)
    if top is None:
        print("best: none (no measured plan fits)")
        return
    print(f"best of the grid: {top.plan}, {_rates(top)} samples/s (median [slowest, fastest] of "
          f"{len(top.seconds)} round(s)), peak {format_bytes(top.peak)}; {len(near)} "
          f"other plans within {100 * NEAR:.0f} % of it: {', '.join(r.plan for r in near) or '–'}")  # fmt: skip


def _arguments() -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(MODEL))
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--profile-batch", type=int, default=1)
    parser.add_argument("--budget", default="3GiB", help="per-rank memory budget")
    parser.add_argument("--grid", help="narrow axes: engines=zero0,... precision=... ckpt=... ga=...")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measurements", type=Path, required=True, help="JSON file, kept and reused")  # fmt: skip
    parser.add_argument("--profile", type=Path, help="a saved ProfileRecord JSON (default: measure)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900, help="seconds per trial")
    parser.add_argument("--dry-run", action="store_true", help="print the plans to run, run none")
    # step_time reads --plans (here the grid is all), --relink (here a kept link stays kept) and
    # the trials' timing (here a step or two is seconds, and a fresh grid keeps the kept one's)
    parser.set_defaults(plans=[], relink=False, warmup=1, steps=2)
    args = parser.parse_args()
    check_arguments(args)
    from autotune.records import AutotuneError, parse_bytes

    try:
        args.budget_bytes = parse_bytes(args.budget, "--budget")
    except AutotuneError as error:
        _refuse(str(error))
    if args.global_batch % args.nproc_per_node:
        _refuse(f"--global-batch {args.global_batch}: not a multiple of {args.nproc_per_node} ranks")  # fmt: skip
    try:
        args.grid = grid_spec(args.global_batch // args.nproc_per_node, args.grid)
    except ValueError as error:
        _refuse(str(error))
    return args


def _predicted(record: Any, plans: list[Any], nproc: int) -> dict[str, int]:
    """Each plan's predicted peak per rank, bytes, by plan JSON."""
    from autotune import compose
    from autotune.records import Machine

    print(f"estimating the peaks of {len(plans)} plans ...", flush=True)
    composition = compose.compose(record, machine=Machine(device="cpu", nproc_per_node=nproc))
    return {plan.model_dump_json(): composition.estimate(plan).memory.peak for plan in plans}


def _list(plans: list[Any], predicted: dict[str, int]) -> None:
    from autotune.records import format_bytes

    for plan in plans:
        peak = format_bytes(predicted[plan.model_dump_json()])
        print(f"  {plan.describe()}: predicted peak {peak}")


def main() -> None:
    args = _arguments()
    from autotune.records import format_bytes

    started, load = time.monotonic(), _load()
    model, sha, record, kept = prepare(args)
    entry = kept.setdefault(sha, {"model": model})
    failed: dict[str, str] = {}
    with exits(args.measurements):
        record, plans = profiled_plans(args, model, record)
        predicted = _predicted(record, plans, args.nproc_per_node)
        bar = args.budget_bytes * SLACK
        dropped = [plan for plan in plans if predicted[plan.model_dump_json()] > bar]
        run = [plan for plan in plans if plan not in dropped]
        print(f"{len(dropped)} of {len(plans)} plans predicted over the budget x {SLACK} "
              f"({format_bytes(bar)}), not run" + ":" * bool(dropped))  # fmt: skip
        _list(dropped, predicted)
        if args.dry_run:
            todo = trials_to_run(run, entry.get("seconds", {}), args.rounds)
            print(f"dry run: {len(run)} plans, {todo} trials to run" + ":" * bool(run))
            _list(run, predicted)
            return
        failed = measure(args, model, run, entry, kept) if run else {}
    # a plan dropped now but measured before (another estimate) is still shown by its measurement
    shown = [p for p in plans if p in run or entry.get("seconds", {}).get(p.model_dump_json())]
    print(f"\nmodel {Path(model).name} ({record.model.parameters:,} parameters), "
          f"{args.nproc_per_node} ranks on cpu, global batch {args.global_batch}, budget "
          f"{format_bytes(args.budget_bytes)} per rank (measured peak: the trial's, largest rank)")  # fmt: skip
    print_table(rows(shown, entry, predicted, failed), args.budget_bytes)
    footer(load, started)


if __name__ == "__main__":
    main()
