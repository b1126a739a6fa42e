"""How many steps does an engine take to settle? Each optimizer step's seconds from the first, on
2 ranks (issue 32).

Usage: TORCH_EXTENSIONS_DIR=~/.cache/autotune-torch-extensions OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu \\
           .venv/bin/python bench/settle_steps.py MODEL --plans "mb=4,stage=0" "mb=4,stage=3" \\
           [--steps 12] [--repeats 2] [--nproc-per-node 2] [--timeout 600]

On ``--nproc-per-node`` ranks (torchrun, this file as the rank job, ended with this script): each
plan's engine built as ``zero_peaks.py``'s rank job builds it, then ``--steps`` optimizer steps,
each timed from a barrier to its end and kept as the slowest rank's seconds; the plans
interleaved, ``--repeats`` times. Printed: every step's seconds, and per plan the median of the
settled steps (the fourth on) against what a trial timed as ``bench/step_time.py`` times its
trials reads: the median of 2 steps after 1 untimed (the files kept before stop 63), of 3 after
2 (``STEADY``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from _model_source import add_model_arguments, model_path
from zero_peaks import _run_ranks, rank_job

SETTLED_FROM = 4
"""The first step counted as settled (1-based)."""
READINGS = ((1, 2), (2, 3))
"""(untimed, timed) steps of a trial as bench/step_time.py has timed them."""


def _rank(job_path: str, out_path: str) -> None:
    """One rank: every plan's steps, ``repeats`` times over; rank 0 writes the seconds."""
    import torch
    import torch.distributed as dist
    from _zero_rank import _engine

    from autotune.records import Plan
    from autotune.runtime.extensions import trial_deepspeed
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.trial.steps import leave_ranks

    job = json.loads(Path(job_path).read_text())
    model_file = load_model_file(job["model"])
    trial_deepspeed().init_distributed(dist_backend="gloo")  # no shared-memory comm op built
    seconds: dict[str, list[list[float]]] = {}
    for _ in range(job["repeats"]):
        for text in job["plans"]:
            engine, step = _engine(model_file, Plan.model_validate_json(text), dist.get_world_size(), "cpu")  # fmt: skip
            steps = []
            for _ in range(job["steps"]):
                dist.barrier()
                start = time.perf_counter()
                step()
                took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                steps.append(float(took))
            seconds.setdefault(text, []).append(steps)
            if hasattr(engine, "destroy"):
                engine.destroy()
            del engine, step
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(seconds))
    leave_ranks()


def _refuse(message: str) -> NoReturn:
    print(f"autotune: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for the rank job")
    args = parser.parse_args()
    if args.steps < SETTLED_FROM + 1:
        _refuse(f"--steps: at least {SETTLED_FROM + 1}, to have settled steps (got {args.steps})")
    if args.repeats < 1:
        _refuse(f"--repeats: must be >= 1 (got {args.repeats})")
    if (args.model is None) == (args.hf_config is None):
        _refuse("MODEL or --hf-config: give one of them")
    if args.model is not None and not Path(args.model).is_file():
        _refuse(f"MODEL {args.model}: no such model file")
    from autotune.records import AutotuneError, Plan, parse_plan

    try:
        plans = [parse_plan(text, Plan(nproc_per_node=args.nproc_per_node), "--plans")
                 for text in args.plans]  # fmt: skip
    except AutotuneError as error:
        _refuse(str(error))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="settle-steps-") as directory:
        work = Path(directory)
        job, out = work / "job.json", work / "out.json"
        job.write_text(json.dumps({"model": model_path(args, work), "steps": args.steps,
                                   "repeats": args.repeats,
                                   "plans": [p.model_dump_json() for p in plans]}))  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={args.nproc_per_node}", f"--log-dir={work / 'torchrun'}",
                   __file__, "--rank-worker", str(job), str(out)]  # fmt: skip
        print(f"waiting for {args.nproc_per_node} ranks to step {len(plans)} plans "
              f"(deadline {args.timeout:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        if not _run_ranks(command, args.timeout) or not out.exists():
            _refuse("the rank job failed (its error above)")
        seconds = json.loads(out.read_text())
    _print(args, plans, seconds)
    print(f"\n{len(plans)} plans x {args.repeats} in {time.time() - started:.0f} s; command: "
          f"bench/settle_steps.py {' '.join(sys.argv[1:])}")  # fmt: skip


def _print(args: argparse.Namespace, plans: list[Any], seconds: dict[str, Any]) -> None:
    name = args.hf_config or Path(args.model).name
    print(
        f"model {name}, {args.nproc_per_node} ranks; each optimizer step's seconds (slowest rank)"
    )
    print("\n| plan | repeat | " + " | ".join(f"step {i}" for i in range(1, args.steps + 1))
          + " |\n|---|---|" + "---|" * args.steps)  # fmt: skip
    for plan in plans:
        for index, steps in enumerate(seconds[plan.model_dump_json()], 1):
            print(f"| {plan.describe()} | {index} | " + " | ".join(f"{s:.3f}" for s in steps) + " |")  # fmt: skip
    print(
        f"\nsettled: the median of steps {SETTLED_FROM}-{args.steps}; a trial's reading, each "
        "repeat's, over it:"
    )
    for plan in plans:
        readings = []
        for untimed, timed in READINGS:
            over = [statistics.median(steps[untimed:untimed + timed])
                    / statistics.median(steps[SETTLED_FROM - 1:]) - 1
                    for steps in seconds[plan.model_dump_json()]]  # fmt: skip
            readings.append(f"{timed} after {untimed}: "
                            + ", ".join(f"{100 * o:+.0f} %" for o in over))  # fmt: skip
        settled = [
            statistics.median(s[SETTLED_FROM - 1 :]) for s in seconds[plan.model_dump_json()]
        ]
        print(f"- {plan.describe()}: settled " + ", ".join(f"{s:.3f}" for s in settled)
              + " s; " + "; ".join(readings))  # fmt: skip


if __name__ == "__main__" and not rank_job(_rank):
    main()
