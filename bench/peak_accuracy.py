"""How close is the predicted peak to the measured one, from the model file alone and from a profile?

For each model: micro-batches (B/2, B, 2B) x checkpointing (none, every block), fp32.
- measured: ``autotune profile``'s peak (live tensor bytes; tests/runtime/test_peak_reference.py
  holds it to torch's memory profiler within 2 %);
- from the model file alone: ``autotune estimate MODEL.py`` (a whole step traced on fake tensors);
- from a profile: ``autotune estimate --profile`` of the profile at B without checkpointing
  (that plan is the profile's own input, marked, and left out of the worst).

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/peak_accuracy.py [--models tiny_llama gpt2_small]
Goal (issue 11): within 5 % on every plan.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from autotune.estimator import estimate_plan, facts_from_profile  # noqa: E402
from autotune.records import Plan  # noqa: E402
from autotune.runtime.profiler import profile  # noqa: E402
from autotune.runtime.trace import facts_from_model_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
MODELS = {"tiny_llama": 4, "mlp_dataloader": 64, "slow_input": 16, "cnn": 8, "gpt2_small": 2}
MIB = 2**20


def _path(name: str, work: Path) -> Path:
    if name == "cnn":
        from _models import CNN

        path = work / "cnn.py"
        path.write_text(CNN)
        return path
    return REPO / "examples" / f"{name}.py"


def bench_model(name: str, base: int, work: Path) -> list[dict[str, Any]]:
    path = _path(name, work)
    started = time.time()
    traced = facts_from_model_file(path, precisions=("fp32",))
    trace_s = time.time() - started
    layers = traced.num_layers
    plans = [
        Plan(micro_batch=mb, checkpoint_blocks=k)
        for k in sorted({0, layers})
        for mb in (max(base // 2, 1), base, 2 * base)
    ]
    measured = {
        plan: profile(
            path,
            batch_size=plan.micro_batch,
            steps=1,
            warmup=1,
            device="cpu",
            checkpointing=bool(plan.checkpoint_blocks),
        )  # fmt: skip
        for plan in plans
    }
    reference = Plan(micro_batch=base)
    facts = facts_from_profile(measured[reference])
    rows = []
    for plan in plans:
        peak = measured[plan].memory.peak
        from_file = estimate_plan(traced, plan).memory.peak
        from_profile = estimate_plan(facts, plan).memory.peak
        row = {
            "model": name,
            "plan": f"mb={plan.micro_batch} ckpt={plan.checkpoint_blocks}/{layers}"
            + (" (profiled input)" if plan == reference else ""),
            "input": plan == reference,
            "peak": peak,
            "file": from_file,
            "file_err": from_file / peak - 1,
            "profile": from_profile,
            "profile_err": from_profile / peak - 1,
        }
        rows.append(row)
        print(f"| {name} | {row['plan']} | {peak / MIB:.2f} | {from_file / MIB:.2f} "
              f"| {100 * row['file_err']:+.1f}% | {from_profile / MIB:.2f} "
              f"| {100 * row['profile_err']:+.1f}% |", flush=True)  # fmt: skip
    params = measured[reference].model.parameters
    print(f"|  | ({params:,} parameters; traced in {trace_s:.1f} s) |  |  |  |  |  |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    started = time.time()
    print("| model | plan (fp32) | measured peak MiB | from the model file alone MiB | error "
          "| from the profile MiB | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peak-accuracy-") as work:
        for name in args.models:
            rows += bench_model(name, MODELS[name], Path(work))
    worst_file = max(rows, key=lambda r: abs(r["file_err"]))
    predicted = [r for r in rows if not r["input"]]
    worst_profile = max(predicted, key=lambda r: abs(r["profile_err"]))
    print(f"\nworst from the model file alone, all {len(rows)} plans: "
          f"{100 * worst_file['file_err']:+.1f}% ({worst_file['model']} {worst_file['plan']})")  # fmt: skip
    print(f"worst from the profile, {len(predicted)} predicted plans (inputs left out): "
          f"{100 * worst_profile['profile_err']:+.1f}% "
          f"({worst_profile['model']} {worst_profile['plan']})")  # fmt: skip
    print(f"{len(rows)} plans in {time.time() - started:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    main()
