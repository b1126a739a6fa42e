"""Trials run one after another in one reused worker group (as ``autotune tune`` runs them): each
plan's per-rank peak, so what a finished trial leaves behind shows in the next one's figure.

Run: OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python bench/worker_leak.py \\
         --hf-config examples/zoo/bert.json --seq-len 32 \\
         --plans "stage=1,mb=4,precision=bf16" "stage=3,mb=4,precision=bf16,ckpt=2" \\
                 "stage=1,mb=4,precision=bf16"
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

    with tempfile.TemporaryDirectory(prefix="worker-leak-") as directory:
        model = model_path(args, Path(directory))
        settings = TrialSettings(model_file=model, steps=2, warmup=1, device="cpu", timeout_s=600)
        print("| # | plan | per-rank peak (bytes) | source |\n|---|---|---|---|")
        with PoolRunner(entry_points=ENTRY_POINTS) as runner:
            for index, text in enumerate(args.plans):
                plan = parse_plan(f"{text},nproc_per_node={args.nproc_per_node}")
                result = runner.run(plan, settings).result
                peaks = (
                    ", ".join(f"{p:,}" for p in result.peak_memory_bytes) if result else "failed"
                )
                source = result.peak_source if result else "-"
                print(f"| {index} | {plan.describe()} | {peaks} | {source} |", flush=True)


if __name__ == "__main__":
    main()
