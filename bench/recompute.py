"""What does checkpointing every block cost, predicted from one profile against measured? (issue 32)

Usage: OMP_NUM_THREADS=1 .venv/bin/python bench/recompute.py MODEL [MODEL ...] --micro-batch 4
           [--rounds 3]

For each model: one fp32 profile at the micro-batch (3 timed steps after 1 warm-up, as
bench/step_time.py takes its own), and from it the estimate's seconds of one step at fp32 and at
bf16 autocast, with every block checkpointed and without: their difference is the recompute the
estimate prices. It is priced twice from the one profile: by the block stack's share of the
forward the profile measured at each precision (``time.block_forward_share``), and by parameter
counts (the same profile without that figure, as every profile was before it). The independent
measure: the same four plans' steps in one process, one runner each, taken in turn for
``--rounds`` rounds after a warm-up step each; per round, the checkpointed step's seconds minus
the plain one's at each precision; printed: the median and range over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from step_time import _load, _Parser, _provenance, _refuse  # noqa: E402

PRECISIONS = ("fp32", "amp_bf16")


def _arguments() -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="MODEL")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for model in args.models:
        if not Path(model).is_file():
            _refuse(f"MODEL {model}: no such model file")
    if args.micro_batch < 1 or args.rounds < 1:
        _refuse("--micro-batch and --rounds must be >= 1")
    return args


def predicted(record: Any, blocks: int) -> tuple[dict[str, float], dict[str, float], str]:
    """Per precision, the recompute of every block the estimate prices from ``record``: by the
    measured block share, and by parameter counts; and the shares as a line."""
    from autotune.estimator import estimate_plan, facts_from_profile
    from autotune.estimator._modelfacts import block_share
    from autotune.records import Plan

    time_ = record.time
    stripped = record.model_copy(
        update={"time": time_.model_copy(update={"block_forward_share": {}})}
    )
    by_share, by_parameters = facts_from_profile(record), facts_from_profile(stripped)
    batch = record.config.batch_size

    def recompute(facts: Any, precision: str) -> float:
        seconds = [estimate_plan(facts, Plan(micro_batch=batch, precision=precision,
                                              checkpoint_blocks=k)).predicted_step_seconds
                   for k in (blocks, 0)]  # fmt: skip
        if None in seconds:
            sys.exit(f"recompute: no step time predicted at {precision}")
        return seconds[0] - seconds[1]

    shares = ", ".join(f"{k} {v:.3f}" for k, v in sorted(time_.block_forward_share.items()))
    line = (f"block stack's share of the forward: measured {shares or 'none'}; by parameter "
            f"counts {block_share(by_parameters):.3f}; bf16_over_fp32 {time_.bf16_over_fp32}")  # fmt: skip
    return ({p: recompute(by_share, p) for p in PRECISIONS},
            {p: recompute(by_parameters, p) for p in PRECISIONS}, line)  # fmt: skip


def measured(model: str, batch: int, blocks: int, rounds: int) -> dict[str, list[float]]:
    """Per precision, each round's checkpointed step seconds minus the plain step's."""
    from autotune.records import Plan
    from autotune.runtime._step import runner_for_plan
    from autotune.runtime.modelfile import load_model_file

    model_file = load_model_file(model)
    runners = {(p, k): runner_for_plan(model_file, Plan(micro_batch=batch, precision=p,
                                                        checkpoint_blocks=k), device="cpu")
               for p in PRECISIONS for k in (0, blocks)}  # fmt: skip
    try:
        for runner in runners.values():
            runner.step()  # warm-up
        gaps: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for index in range(rounds):
            print(f"  round {index + 1} of {rounds}", file=sys.stderr, flush=True)
            seconds = {key: runner.step().total for key, runner in runners.items()}
            for p in PRECISIONS:
                gaps[p].append(seconds[(p, blocks)] - seconds[(p, 0)])
        return gaps
    finally:
        for runner in runners.values():
            runner.close()


def main() -> None:
    from autotune.runtime.profiler import profile

    args = _arguments()
    started, load = time.monotonic(), _load()
    batch, rounds = args.micro_batch, args.rounds
    print("| model | precision | predicted: measured share (s) | predicted: parameter counts (s) "
          "| measured: median [min, max] (s) | error %: share | error %: parameters |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    notes: list[str] = []
    errors: dict[str, list[float]] = {"share": [], "parameters": []}
    for model in args.models:
        print(
            f"profiling {Path(model).name} at micro-batch {batch} ...", file=sys.stderr, flush=True
        )
        record = profile(model, batch_size=batch, steps=3, warmup=1, device="cpu")
        blocks = record.model.block_stack.count if record.model.block_stack else 0
        if not blocks:
            sys.exit(f"recompute: {model} has no block stack to checkpoint")
        by_share, by_parameters, line = predicted(record, blocks)
        notes.append(f"{Path(model).name} ({blocks} blocks): {line}")
        print(f"measuring {Path(model).name}: 4 plans x {rounds} rounds ...", file=sys.stderr, flush=True)  # fmt: skip
        gaps = measured(model, batch, blocks, rounds)
        for p in PRECISIONS:
            mid = statistics.median(gaps[p])
            share_err = 100 * (by_share[p] / mid - 1)
            param_err = 100 * (by_parameters[p] / mid - 1)
            errors["share"].append(abs(share_err))
            errors["parameters"].append(abs(param_err))
            print(f"| {Path(model).name} | {p} | {by_share[p]:.3f} | {by_parameters[p]:.3f} | "
                  f"{mid:.3f} [{min(gaps[p]):.3f}, {max(gaps[p]):.3f}] | {share_err:+.1f} | "
                  f"{param_err:+.1f} |", flush=True)  # fmt: skip
    print()
    for note in notes:
        print(note)
    print(f"|error| median over {len(errors['share'])} rows: measured share "
          f"{statistics.median(errors['share']):.1f} %, parameter counts "
          f"{statistics.median(errors['parameters']):.1f} %")  # fmt: skip
    print(f"load average (1/5/15 min): {load} at start, {_load()} at end; "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print(f"command: bench/recompute.py {' '.join(sys.argv[1:])}")
    print(_provenance())


if __name__ == "__main__":
    main()
