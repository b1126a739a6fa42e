"""How steady is the profile's bf16 / fp32 compute probe from one short profile to the next, and
where does it sit against measured bf16 and fp32 trials of the same plans? (issue 32)

Usage: .venv/bin/python bench/bf16_probe.py MODEL --per-rank 4 [--repeats 5]
           [--measurements bench/data/step_time_124m.json]

Each repeat is one of tune's short profiles (``compose.short_profiles``) in a fresh process, as
tune takes it; printed: its ``time.bf16_over_fp32``, its fp32 forward and backward per sample and
its seconds, then the median and range over the repeats. The independent reference: in the kept
step-time measurements, each plan measured at both precisions (bf16 over fp32 seconds per whole
step: optimizer and communication included, which bf16 does not speed up, so the compute's own
ratio lies at or below it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from step_time import _load, _Parser, _provenance, _refuse

ONE = """
import json, sys, time
from autotune import compose
start = time.monotonic()
record = compose.short_profiles(sys.argv[1], int(sys.argv[2]), "cpu")
print(json.dumps({"ratio": record.time.bf16_over_fp32, "seconds": time.monotonic() - start,
                  "per_sample": (record.time.forward + record.time.backward)
                  / record.config.batch_size}))
"""
DEADLINE_S = 900


def _arguments() -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--per-rank", type=int, default=4, help="tune's per-rank batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--measurements", type=Path,
                        help="kept bench/step_time.py measurements of the model")  # fmt: skip
    args = parser.parse_args()
    if not Path(args.model).is_file():
        _refuse(f"{args.model}: no such model file")
    if args.repeats < 1 or args.per_rank < 1:
        _refuse("--repeats and --per-rank must be >= 1")
    if args.measurements is not None and not args.measurements.is_file():
        _refuse(f"--measurements {args.measurements}: no such file")
    return args


def profile_once(model: str, per_rank: int) -> dict[str, float]:
    """One short profile in a fresh process (deadline :data:`DEADLINE_S`)."""
    done = subprocess.run([sys.executable, "-c", ONE, model, str(per_rank)], capture_output=True,
                          text=True, timeout=DEADLINE_S, check=False)  # fmt: skip
    if done.returncode:
        sys.exit(f"bf16_probe: the profile failed:\n{done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def measured_ratios(path: Path) -> list[tuple[str, float]]:
    """Each kept plan measured at both precisions: bf16 over fp32 median seconds per step."""
    (entry,) = json.loads(path.read_text()).values()
    seconds = {key: statistics.median(runs) for key, runs in entry["seconds"].items() if runs}
    ratios = []
    for key, fp32 in seconds.items():
        plan = json.loads(key)
        if plan["precision"] != "fp32":
            continue
        twin = json.dumps({**plan, "precision": "bf16"}, separators=(",", ":"))
        if twin in seconds:
            name = (f"{plan['engine']} stage {plan['zero_stage']}, ckpt {plan['checkpoint_blocks']}, "
                    f"mb {plan['micro_batch']} ga {plan['grad_accum']}")  # fmt: skip
            ratios.append((name, seconds[twin] / fp32))
    return ratios


def main() -> None:
    args = _arguments()
    started, load = time.monotonic(), _load()
    print(f"{args.repeats} short profiles of {Path(args.model).name} at per-rank batch "
          f"{args.per_rank}, each in a fresh process", flush=True)  # fmt: skip
    ratios = []
    for index in range(args.repeats):
        print(f"waiting for profile {index + 1} of {args.repeats} (deadline {DEADLINE_S} s)",
              file=sys.stderr, flush=True)  # fmt: skip
        one = profile_once(args.model, args.per_rank)
        ratios.append(one["ratio"])
        print(f"  {index + 1}: bf16_over_fp32 {one['ratio']:.3f}, fp32 forward+backward "
              f"{one['per_sample']:.3f} s per sample, {one['seconds']:.0f} s", flush=True)  # fmt: skip
    print(f"bf16_over_fp32: median {statistics.median(ratios):.3f}, range "
          f"[{min(ratios):.3f}, {max(ratios):.3f}] over {len(ratios)} profiles")  # fmt: skip
    if args.measurements is not None:
        kept = measured_ratios(args.measurements)
        print(f"measured bf16 / fp32 seconds per step, {len(kept)} plans of {args.measurements}:")
        for name, ratio in kept:
            print(f"  {name}: {ratio:.3f}")
        if kept:
            values = [ratio for _, ratio in kept]
            print(f"  median {statistics.median(values):.3f}, range [{min(values):.3f}, "
                  f"{max(values):.3f}] (whole steps: the compute's own ratio is at or below)")  # fmt: skip
    print(f"load average (1/5/15 min): {load} at start, {_load()} at end; "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print(f"command: bench/bf16_probe.py {' '.join(sys.argv[1:])}")
    print(_provenance())


if __name__ == "__main__":
    main()
