"""ZeRO-Offload on CPU ranks: does it train as the plan without it, and is its host side what the
estimate predicts, part by part?

For each ``--plans`` entry with ``offload_optimizer=cpu`` and its twin without offload, one
``torch.distributed.run`` of ``--nproc-per-node`` ranks trains ``--steps`` optimizer steps of the model
file under DeepSpeed (its emitted config; a torch client optimizer, so no CPU Adam build), then
reads what DeepSpeed's optimizer keeps on the host (``tests/_ds_two_rank.py::offloaded_bytes``:
the fp32 master partition, the optimizer's moments, the gradient partitions and buffers, the
16-bit copy-back and pinned buffers). It prints each part against
``autotune.estimator.host_bytes_per_rank`` (the facts traced from the model file, nothing
run in this process) and each plan's losses against its twin's.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python bench/offload_host.py examples/gpt2_small.py --plans
"stage=2,precision=bf16,offload_optimizer=cpu" "stage=3,precision=bf16,offload_optimizer=cpu"``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # offloaded_bytes lives with the tests' rank child
sys.path.insert(0, str(REPO / "bench"))


def _rank(job_path: str, out_path: str) -> None:
    """One rank: each plan trained from the same seed; rank 0 writes losses and host parts."""
    import torch
    import torch.distributed as dist
    from _ds_two_rank import offloaded_bytes
    from _zero_rank import _engine

    from autotune.records import Plan
    from autotune.runtime.extensions import trial_deepspeed
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.trial.steps import leave_ranks

    job = json.loads(Path(job_path).read_text())
    model_file = load_model_file(job["model"])
    trial_deepspeed().init_distributed(dist_backend="gloo")  # no shared-memory comm op built
    world = dist.get_world_size()
    results = {}
    for text in job["plans"]:
        plan = Plan.model_validate_json(text)
        torch.manual_seed(0)
        engine, _ = _engine(model_file, plan, world, "cpu")
        torch.manual_seed(1 + dist.get_rank())
        batches = model_file.batches(plan.micro_batch)
        losses = []
        for _ in range(job["steps"]):
            for _ in range(plan.grad_accum):
                loss = model_file.loss(engine, model_file.move(next(batches), "cpu"))
                engine.backward(loss)
                engine.step()
            losses.append(float(loss.detach()))
        host = offloaded_bytes(engine.optimizer) if plan.offload_optimizer != "none" else None
        results[text] = {"losses": losses, "host": host}
        engine.destroy()
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))
    leave_ranks()


def _run_ranks(model: str, plans: list[Any], nproc: int, steps: int, timeout: float) -> dict:
    from zero_peaks import _run_ranks as _ranks_ran  # ended whole at the deadline or an interrupt

    with tempfile.TemporaryDirectory(prefix="offload-host-") as directory:
        job, out = Path(directory) / "job.json", Path(directory) / "out.json"
        job.write_text(json.dumps({"model": model, "steps": steps,
                                   "plans": [p.model_dump_json() for p in plans]}))  # fmt: skip
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", f"--log-dir={Path(directory) / 'torchrun'}",
                   __file__, "--rank-worker", str(job), str(out)]  # fmt: skip
        print(f"waiting for {nproc} ranks to train {len(plans)} plans (deadline {timeout:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
        if not _ranks_ran(command, timeout) or not out.exists():
            sys.exit("offload_host: the rank job failed (its error above)")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--plans", nargs="+", required=True)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the rank job")
    args = parser.parse_args()
    from autotune.compose import model_file_facts
    from autotune.estimator import host_bytes_per_rank
    from autotune.records import parse_plan

    started = time.time()
    model = str(Path(args.model).resolve())
    plans = [parse_plan(f"{text},nproc_per_node={args.nproc_per_node}") for text in args.plans]
    if any(plan.offload_optimizer == "none" for plan in plans):
        parser.error("--plans: each plan offloads its optimizer (offload_optimizer=cpu)")
    twins = [plan.with_changes(offload_optimizer="none", offload_param="none") for plan in plans]
    facts = model_file_facts(model, ("bf16",), "cpu")
    results = _run_ranks(model, [*plans, *twins], args.nproc_per_node, args.steps, args.timeout)
    print(f"model {Path(args.model).name}: {facts.parameters:,} parameters; {args.nproc_per_node} CPU ranks; "
          f"{args.steps} steps; host parts read from DeepSpeed's optimizer on rank 0")  # fmt: skip
    print("\n| plan | part | predicted MiB | measured MiB | error |\n|---|---|---|---|---|")
    for plan in plans:
        predicted = asdict(host_bytes_per_rank(
            parameters=facts.parameters, trainable=facts.trainable_parameters,
            precision=plan.precision, zero_stage=plan.zero_stage, world_size=plan.world_size,
            grad_accum=plan.grad_accum, largest_parameter=facts.largest_parameter,
            optimizer_bytes_per_param=facts.optimizer_bytes_per_param, offload_optimizer=True,
            offload_param=plan.offload_param != "none",
        ))  # fmt: skip
        measured = results[plan.model_dump_json()]["host"]
        for part, value in [*predicted.items(), ("total", sum(predicted.values()))]:
            got = sum(measured.values()) if part == "total" else measured[part]
            error = "–" if not value else f"{100 * (got / value - 1):+.1f}%"
            print(
                f"| {plan.describe()} | {part} | {value / 2**20:.2f} | {got / 2**20:.2f} | {error} |"
            )
    print("\n| plan | losses | without offload | largest difference |\n|---|---|---|---|")
    for plan, twin in zip(plans, twins, strict=True):
        mine = results[plan.model_dump_json()]["losses"]
        theirs = results[twin.model_dump_json()]["losses"]
        worst = max(abs(a / b - 1) for a, b in zip(mine, theirs, strict=True))
        print(f"| {plan.describe()} | {', '.join(f'{x:.4f}' for x in mine)} | "
              f"{', '.join(f'{x:.4f}' for x in theirs)} | {100 * worst:.3f} % |")  # fmt: skip
    print(f"\n{len(plans)} plans and their twins in {time.time() - started:.0f} s; command: "
          f"bench/offload_host.py {' '.join(sys.argv[1:])}")  # fmt: skip


if __name__ == "__main__":
    from zero_peaks import rank_job

    if not rank_job(_rank):
        main()
