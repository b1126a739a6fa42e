"""Per-rank peak of DeepSpeed ZeRO and FSDP2 plans: predicted, measured by autotune's trial, and by torch.

For each plan, three figures per rank:
- predicted: ``autotune estimate`` from one single-process profile of the model file;
- trial: what ``autotune tune`` judges on (a real trial, ``SubprocessRunner``, live tensor bytes);
- torch: torch.profiler's memory timeline inside each rank over one optimizer step (after
  three warm-up steps) of the same DeepSpeed engine and config: the independent instrument.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/zero_peaks.py MODEL.py --profile-batch 2 \\
         --plans "stage=1,mb=2,ga=2" "stage=2,mb=2,ga=2" "stage=3,mb=2,ga=2" [--nproc 2]
Prints a markdown table (bytes in MiB) and the worst error of the predictions.
An ``engine=fsdp2`` plan runs ``fully_shard`` per block and root (``autotune.runtime.trial.fsdp2``)
instead of a DeepSpeed engine. Each plan runs in ranks of its own (a finished ZeRO-3
engine stays alive in its process, and would count in the next plan's memory).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the profiler reference lives with the tests

MIB = 2**20
_ATTEMPTS = 4
_WARMUP = 3
"""Steps before the measured one: stage 3 traces its parameter order over the first two
and only then keeps gathered parameters for their reuse (its steady state)."""
_PROFILED = 1
"""Steps under the profiler (with idle pre-step buffers counted, consecutive steps agree)."""


def _step(model_file: Any, engine: Any, batches: Any, grad_accum: int) -> None:
    """One optimizer step of the engine: ``grad_accum`` micro-batches."""
    for _ in range(grad_accum):
        batch = model_file.move(next(batches), engine.device)
        loss = model_file.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        del loss, batch


def rank_main(plans_path: str, out_path: str) -> None:
    """One rank: every plan's engine, warm-up steps, then one step under torch.profiler."""
    import contextlib
    import gc

    import deepspeed
    import torch
    import torch.distributed as dist
    from _reference import _peak
    from torch.profiler import ProfilerActivity, profile

    from autotune.emit import emit_deepspeed_config
    from autotune.records import Plan
    from autotune.runtime._blocks import apply_checkpointing
    from autotune.runtime.modelfile import load_model_file

    job = json.loads(Path(plans_path).read_text())
    model_file = load_model_file(job["model"])
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for text in job["plans"]:
        plan = Plan.model_validate_json(text)
        torch.manual_seed(0)
        model = model_file.build_model()
        apply_checkpointing(model, plan.checkpoint_blocks)
        batches = model_file.batches(plan.micro_batch)
        if plan.engine == "fsdp2":
            engine, step = _fsdp2_engine(model_file, model, plan, batches)
        else:
            optimizer = model_file.build_optimizer(
                [p for p in model.parameters() if p.requires_grad]
            )
            parameters = sum(p.numel() for p in model.parameters())
            config = emit_deepspeed_config(plan, world_size=world, parameters=parameters).config
            with contextlib.redirect_stdout(sys.stderr):
                engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
            step = functools.partial(_step, model_file, engine, batches, plan.grad_accum)
        for _ in range(_WARMUP):
            step()
        for attempt in range(_ATTEMPTS):
            gc.collect()
            # Everything alive now is the engine's state (flat buffers and partitions are
            # not all reachable from the model or the optimizer): all of it counts as present.
            keep = _storages(gc.get_objects())
            with profile(
                activities=[ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            ) as prof:
                for _ in range(_PROFILED):
                    step()
            try:
                reference: Any = _peak(prof, keep)
            except AssertionError:
                # torch's data-flow analysis sometimes trips over flatten_dense_tensors
                # reusing an address ("duplicate outputs"): profile the next step instead,
                # on every rank (the ranks' steps must stay in lockstep).
                reference = None
            failed: list[Any] = [None] * world
            dist.all_gather_object(failed, reference is None)
            if not any(failed):
                break
            if attempt + 1 == _ATTEMPTS:
                print(f"{plan.describe()}: torch's memory profile failed on every attempt",
                      file=sys.stderr)  # fmt: skip
                reference = None
        measured = {"peak": None, "at_peak": {}}
        if reference is not None and not any(failed):
            measured = {"peak": reference.peak, "at_peak": reference.at_peak}
        results.append(measured)
        if hasattr(engine, "destroy"):
            engine.destroy()
        del engine, model, step
        gc.collect()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.barrier()
    # Torn down here, not at interpreter exit: a rank whose gloo group outlives its peer's
    # exit can abort (SIGABRT) in the group's destructor.
    dist.destroy_process_group()


def _storages(objects: list[Any]) -> dict[int, int]:
    """Every CPU tensor's storage, address to bytes (a DTensor's local shard, not the wrapper)."""
    import torch
    from torch.distributed.tensor import DTensor

    keep = {}
    for obj in objects:
        if isinstance(obj, DTensor):
            obj = obj._local_tensor
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            keep[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
    return keep


def _fsdp2_engine(model_file: Any, model: Any, plan: Any, batches: Any) -> tuple[Any, Any]:
    """The model sharded by ``fully_shard`` as the plan says, and its step (autotune's runtime)."""
    from autotune.runtime.trial.fsdp2 import apply_fsdp2, fsdp2_step

    apply_fsdp2(model, plan, "cpu")
    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])

    def loss_of() -> Any:
        return model_file.loss(model, model_file.move(next(batches), "cpu"))

    step = fsdp2_step(model, optimizer, loss_of, plan)
    return model, step


def _torch_peaks(model: str, plans: list[Any], nproc: int, work: Path) -> list[list[dict]]:
    """torch.profiler's per-rank figures, each plan in ranks of its own."""
    found = []
    for index, plan in enumerate(plans):
        job = work / f"job{index}.json"
        job.write_text(json.dumps({"model": model, "plans": [plan.model_dump_json()]}))
        out = work / f"out{index}.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", __file__, "--rank-worker", str(job), str(out),
        ]  # fmt: skip
        _run_ranks(command)
        found.append([rank[0] for rank in json.loads(out.read_text())])
    return found


_INSTRUMENT_ABORTS = 2
"""Reruns of a rank job that a C++ ``terminate`` (no exception: a thread of torch's profiler or
gloo torn down) ended: seen in about 1 run in 3 of the FSDP2 jobs on an AVX-512 CPU, after the
profiled steps; a failure of the instrument, not of the plan, so the job is run again."""


def _run_ranks(command: list[str]) -> None:
    """Run one rank job; rerun it where the instrument, not the plan, aborted."""
    for attempt in range(_INSTRUMENT_ABORTS + 1):
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=3600, check=False)  # fmt: skip
        sys.stderr.write(done.stderr)
        aborted = "terminate called without an active exception" in done.stderr
        if done.returncode == 0 or not aborted or attempt == _INSTRUMENT_ABORTS:
            break
        print(f"rank job aborted in a C++ terminate (attempt {attempt + 1}); running it again",
              file=sys.stderr)  # fmt: skip
    done.check_returncode()


def _trial_peaks(model: str, plans: list[Any], work: Path) -> list[list[int]]:
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import SubprocessRunner, TrialSettings

    runner = SubprocessRunner(
        entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=work / "trials"
    )
    # the tracked step is the fourth, as the profiled one in each rank (stage 3 steady state)
    settings = TrialSettings(model_file=model, steps=2, warmup=1, device="cpu", timeout_s=1800)
    peaks = []
    for plan in plans:
        report = runner.run(plan, settings)
        if report.result is None or not report.result.peak_memory_bytes:
            raise SystemExit(f"trial of {plan.describe()} failed: {report.stderr_tail[-800:]}")
        peaks.append(report.result.peak_memory_bytes)
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--plans", nargs="+", required=True)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--profile-batch", type=int, default=2)
    parser.add_argument(
        "--skip-torch",
        action="store_true",
        help="no torch.profiler ranks (its event record of a 124M-parameter step needs about "
        "9.5 GB per rank, more than two ranks get on this 24 GiB machine)",
    )
    args = parser.parse_args()
    from autotune.estimator import estimate_plan, facts_from_profile
    from autotune.records import parse_plan
    from autotune.runtime.profiler import profile

    started = time.time()
    model = str(Path(args.model).resolve())
    plans = [parse_plan(f"{text},gpus={args.nproc}") for text in args.plans]
    record = profile(model, batch_size=args.profile_batch, steps=2, warmup=1, device="cpu")
    facts = facts_from_profile(record)
    predicted = [estimate_plan(facts, plan).memory for plan in plans]
    with tempfile.TemporaryDirectory(prefix="zero-peaks-") as directory:
        work = Path(directory)
        trials = _trial_peaks(model, plans, work)
        none: list[list[dict[str, Any]]] = [[{"peak": None, "at_peak": {}}] * args.nproc] * len(
            plans
        )
        torch_peaks = none if args.skip_torch else _torch_peaks(model, plans, args.nproc, work)
    print(f"model {Path(args.model).name}: {record.model.parameters:,} parameters; "
          f"profile at micro-batch {args.profile_batch}, {args.nproc} ranks")  # fmt: skip
    print(
        "\n| plan | rank | predicted MiB | trial (live tensors) MiB | torch.profiler MiB "
        "| predicted vs torch | torch's categories at its peak (MiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    worst = (0.0, "")
    for plan, memory, trial, ranks in zip(plans, predicted, trials, torch_peaks, strict=True):
        for rank, (live, measured) in enumerate(zip(trial, ranks, strict=True)):
            reference = measured["peak"] or live  # the trial's figure where torch's is not taken
            error = memory.peak / reference - 1
            if abs(error) > abs(worst[0]):
                worst = (error, f"{plan.describe()} rank {rank}")
            parts = ", ".join(
                f"{name} {size / MIB:.2f}" for name, size in measured["at_peak"].items() if size
            )
            shown = "–" if measured["peak"] is None else f"{measured['peak'] / MIB:.2f}"
            print(f"| {plan.describe()} | {rank} | {memory.peak / MIB:.2f} | {live / MIB:.2f} "
                  f"| {shown} | {100 * error:+.1f}% | {parts or '–'} |")  # fmt: skip
    against = "the trials (--skip-torch)" if args.skip_torch else "torch.profiler"
    print(f"\nworst prediction vs {against}: {100 * worst[0]:+.1f}% ({worst[1]})")
    print(f"{len(plans)} plans in {time.time() - started:.0f} s; command: {' '.join(sys.argv)}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-worker":
        rank_main(sys.argv[2], sys.argv[3])
    else:
        main()
