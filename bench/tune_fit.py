"""Did every trial a tune predicted to fit stay within its budget? Reads `autotune-tune.json`.

Run: .venv/bin/python bench/tune_fit.py OUT_DIR/autotune-tune.json [--repredict]
Prints one row per trial: the plan, its outcome, the predicted per-rank peak and its source, the
measured per-rank peak (the largest rank's), their ratio and whether it stayed within the budget;
then the range of the ratios and the count over budget.

``--repredict`` profiles the record's model file again as ``tune`` does (micro-batch
``min(2, per rank)``, 16-bit activations traced) and predicts every trial's plan with the current
estimate: the measured peaks of a past run against an estimate changed since, in two more columns.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--repredict", action="store_true",
                        help="predict every trial's plan again with the current estimate")  # fmt: skip
    args = parser.parse_args()
    from autotune.records import Plan, read_record
    from autotune.search import TuneRecord

    record = read_record(args.record, TuneRecord, "tune record")
    budget = record.device_memory
    if budget is None:
        parser.error(f"{args.record}: the tune ran without --device-memory")
    again = _repredict(record) if args.repredict else {}
    print(f"budget {budget / GIB:.2f} GiB per rank, margin {record.margin}; "
          f"{len(record.trials)} trials")  # fmt: skip
    more = " re-predicted GiB | measured / re-predicted |" if again else ""
    print("| # | plan | outcome | predicted GiB (source) | measured GiB | measured / predicted |"
          " within budget |" + more + "\n" + "|---" * (9 if again else 7) + "|")  # fmt: skip
    ratios, redone, over = [], [], 0
    for trial in record.trials:
        plan = Plan.model_validate(trial.plan).describe()
        predicted, measured = trial.predicted_peak_bytes, trial.peak_memory_bytes
        shown = f"{predicted / GIB:.3f} ({trial.prediction_source})" if predicted else "–"
        now = again.get(trial.number)
        extra = f" {now / GIB:.3f} |" if now else " – |" if again else ""
        if measured and predicted:
            ratios.append(measured / predicted)
            over += measured > budget
            if now:
                redone.append(measured / now)
                extra += f" {measured / now:.3f} |"
            print(f"| {trial.number} | {plan} | {trial.outcome} | {shown} | {measured / GIB:.3f} | "
                  f"{measured / predicted:.3f} | {'yes' if measured <= budget else 'NO'} |"
                  + extra)  # fmt: skip
        else:
            why = (trial.reason or "")[:90]
            extra += " – |" if again else ""
            print(f"| {trial.number} | {plan} | {trial.outcome or 'not run'} | {shown} | – | – | "
                  f"{why} |" + extra)  # fmt: skip
    if ratios:
        print(f"ran {len(ratios)}; measured / predicted {min(ratios):.3f} to {max(ratios):.3f}; "
              f"over the budget: {over}")  # fmt: skip
    if redone:
        print(f"measured / re-predicted {min(redone):.3f} to {max(redone):.3f}")


def _repredict(record: Any) -> dict[int, int]:
    """Each trial's per-rank peak as the current estimate predicts it, from a fresh profile."""
    from autotune.compose import compose, short_profiles
    from autotune.records import Machine, Plan

    plans = {trial.number: Plan.model_validate(trial.plan) for trial in record.trials}
    machine = Machine(device="cpu", device_memory=record.device_memory, margin=record.margin,
                      nproc_per_node=record.nproc_per_node, nnodes=record.nnodes)  # fmt: skip
    profile = short_profiles(record.model_file, record.global_batch // machine.world_size, "cpu")
    predict = compose(profile, machine=machine).prediction
    return {number: predict(plan).peak_bytes or 0 for number, plan in plans.items()}


if __name__ == "__main__":
    main()
