"""A CPU trial's peak from its warm-up step against one more step after the timed ones: is the
steady-state peak derived from the first step (the storages it kept counted from its start) the
peak the extra step measures, per rank?

Each plan runs twice in one reused worker group, once per measure (``peak_step`` warmup, then
extra), so both see the same process state; the extra step is the reference (the measure trials
used before, the same live-tensor tracker over a plain later step).

Run: OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python bench/peak_step.py examples/tiny_llama.py \\
         --plans "stage=0,mb=4,precision=bf16" "stage=3,mb=1,ga=4" "engine=fsdp2,stage=3,mb=4"
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from _model_source import model_path, parse_model_arguments


def main() -> None:
    args = parse_model_arguments(__doc__)
    from autotune.records import parse_plan
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import PoolRunner, TrialSettings

    errors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="peak-step-") as directory:
        model = model_path(args, Path(directory))
        base = TrialSettings(model_file=model, steps=1, warmup=1, device="cpu", timeout_s=900,
                             interval_width=None, sweep_link=False)  # fmt: skip
        print("| plan | per-rank peak, warm-up step (bytes) | per-rank peak, extra step (bytes) "
              "| warm-up / extra |\n|---|---|---|---|")  # fmt: skip
        with PoolRunner(entry_points=ENTRY_POINTS) as runner:
            for text in args.plans:
                plan = parse_plan(f"{text},nproc_per_node={args.nproc_per_node}")
                peaks = {}
                for where in ("warmup", "extra"):
                    settings = base.model_copy(update={"peak_step": where})
                    result = runner.run(plan, settings).result
                    ok = result is not None and result.peak_source == "cpu_live_tensors"
                    peaks[where] = result.peak_memory_bytes if ok and result else None
                first, extra = peaks["warmup"], peaks["extra"]
                if first is None or extra is None:
                    print(f"| {plan.describe()} | {first} | {extra} | failed |", flush=True)
                    continue
                ratios = [a / b for a, b in zip(first, extra, strict=True)]
                errors += [abs(r - 1) for r in ratios]
                print(f"| {plan.describe()} | {', '.join(f'{p:,}' for p in first)} | "
                      f"{', '.join(f'{p:,}' for p in extra)} | "
                      f"{', '.join(f'{r:.4f}' for r in ratios)} |", flush=True)  # fmt: skip
    if errors:
        exact = sum(e == 0 for e in errors)
        print(f"\n{len(errors)} rank peaks: {exact} equal, largest |warm-up / extra - 1| "
              f"{100 * max(errors):.2f} %")  # fmt: skip


if __name__ == "__main__":
    main()
