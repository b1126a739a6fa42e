"""Did every trial a tune predicted to fit stay within its budget? Reads `autotune-tune.json`.

Run: .venv/bin/python bench/tune_fit.py OUT_DIR/autotune-tune.json
Prints one row per trial: the plan, its outcome, the predicted per-rank peak and its source, the
measured per-rank peak (the largest rank's), their ratio and whether it stayed within the budget;
then the range of the ratios and the count over budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path)
    args = parser.parse_args()
    from autotune.records import Plan, read_record
    from autotune.search import TuneRecord

    record = read_record(args.record, TuneRecord, "tune record")
    budget = record.device_memory
    assert budget is not None, "the tune ran without --device-memory"
    print(f"budget {budget / GIB:.2f} GiB per rank, margin {record.margin}; "
          f"{len(record.trials)} trials")  # fmt: skip
    print("| # | plan | outcome | predicted GiB (source) | measured GiB | measured / predicted |"
          " within budget |\n|---|---|---|---|---|---|---|")  # fmt: skip
    ratios, over = [], 0
    for trial in record.trials:
        plan = Plan.model_validate(trial.plan).describe()
        predicted, measured = trial.predicted_peak_bytes, trial.peak_memory_bytes
        shown = f"{predicted / GIB:.3f} ({trial.prediction_source})" if predicted else "–"
        if measured and predicted:
            ratios.append(measured / predicted)
            over += measured > budget
            print(f"| {trial.number} | {plan} | {trial.outcome} | {shown} | {measured / GIB:.3f} | "
                  f"{measured / predicted:.3f} | {'yes' if measured <= budget else 'NO'} |")  # fmt: skip
        else:
            why = (trial.reason or "")[:90]
            print(
                f"| {trial.number} | {plan} | {trial.outcome or 'not run'} | {shown} | – | – | {why} |"
            )
    if ratios:
        print(f"ran {len(ratios)}; measured / predicted {min(ratios):.3f} to {max(ratios):.3f}; "
              f"over the budget: {over}")  # fmt: skip


if __name__ == "__main__":
    main()
