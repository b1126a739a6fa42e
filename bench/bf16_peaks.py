"""What a 16-bit plan's per-rank peak is made of: measured by category in each rank, beside the estimate.

For each plan, each rank runs the engine a trial runs (DeepSpeed from the emitted config, or
FSDP2's ``fully_shard``), three warm-up steps, then one step under autotune's live-tensor tracker
(the trial's own measure) with every storage named: the module's parameters (flat 16-bit buffers,
gathered ZeRO-3 parameters), DeepSpeed's fp32 master copy, the optimizer's moments, the saved
activations (counted as the profile counts them), what else the engine held before the step
(``engine``: gradient buffers, partitions) and what the step made and freed (``temporaries``).
Beside it, the estimate from a single-process fp32 profile: with the 16-bit activations by
formula (fp32 x 0.5, as before) and traced on fake tensors at the plan's precision.

Run: OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu .venv/bin/python bench/bf16_peaks.py examples/tiny_llama.py \\
         --plans "stage=1,mb=2,precision=bf16" "engine=fsdp2,stage=3,mb=4,precision=bf16"
     (or --hf-config examples/zoo/bert.json --seq-len 32 for a zoo model)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _model_source import add_model_arguments, model_path
from zero_peaks import _run_ranks, rank_job

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
MIB = 2**20
_DEADLINE_S = 3600
"""Seconds one plan's rank job may take before it is ended, ranks and all."""
_WARMUP = 3
_MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",
           "fp32_groups_flat_partition")  # fmt: skip
"""DeepSpeed's fp32 master partitions: ZeRO-1/2, ZeRO-3, BF16_Optimizer (stage 0)."""
_SHOWN = ("parameters", "master", "optimizer_states", "engine", "gradients", "activations",
          "temporaries", "buffers")  # fmt: skip


def _engine(model_file: Any, model: Any, plan: Any, world: int) -> tuple[Any, Any, Any]:
    """The engine, the module the forward runs, and its torch optimizer (as the trials build them)."""
    if plan.engine == "fsdp2":
        from autotune.runtime.trial.fsdp2 import apply_fsdp2

        apply_fsdp2(model, plan, "cpu")
        optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
        return None, model, optimizer
    import deepspeed

    from autotune.emit import emit_deepspeed_config

    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
    parameters = sum(p.numel() for p in model.parameters())
    config = emit_deepspeed_config(plan, world_size=world, parameters=parameters).config
    config["zero_allow_untested_optimizer"] = True
    with contextlib.redirect_stdout(sys.stderr):
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, engine, engine.optimizer


def rank_main(job_path: str, out_path: str) -> None:
    """One rank: the plan's engine, warm-up steps, one step with every live storage named."""
    import torch
    import torch.distributed as dist

    from autotune.records import Plan
    from autotune.runtime import _memory as mem
    from autotune.runtime._blocks import apply_checkpointing
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.trial.deepspeed_engine import _cast_floats
    from autotune.runtime.trial.steps import leave_ranks, tensors_on

    job = json.loads(Path(job_path).read_text())
    model_file, plan = load_model_file(job["model"]), Plan.model_validate_json(job["plan"])
    if plan.engine == "fsdp2":
        dist.init_process_group("gloo")
    else:
        from autotune.runtime.extensions import trial_deepspeed

        trial_deepspeed().init_distributed(dist_backend="gloo")  # no shared-memory comm op built
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = model_file.build_model()
    apply_checkpointing(model, plan.checkpoint_blocks)
    engine, forward_module, optimizer = _engine(model_file, model, plan, world)
    batches = model_file.batches(plan.micro_batch)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    phase = ["before"]
    tracking: list[Any] = []  # the tracker, once the measured step starts

    def micro() -> None:
        batch = model_file.move(next(batches), "cpu")
        if dtype is not None and engine is not None:
            batch = _cast_floats(batch, dtype)
        phase[0] = "forward"
        keys: set[int] = set()

        def pack(tensor: Any) -> Any:
            keys.add(mem.storage_key(tensor))
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model_file.loss(forward_module, batch)
        _name(tracking, keys, "activations")  # saved weights keep their names
        phase[0] = "backward"
        if engine is not None:
            engine.backward(loss)
        else:
            (loss.float() / plan.grad_accum).backward()
        grads = _local(p.grad for p in model.parameters() if p.grad is not None)
        _name(tracking, {mem.storage_key(g) for g in grads}, "gradients")
        if engine is not None:
            phase[0] = "step"
            engine.step()
        del loss, batch, grads

    def step() -> None:
        for _ in range(plan.grad_accum):
            micro()
        if engine is None:
            phase[0] = "step"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(_WARMUP):
        step()
    tracker = _PhaseTracker(torch.device("cpu"), phase)
    existing = tensors_on(torch.device("cpu"))
    inner = getattr(optimizer, "optimizer", optimizer)
    with tracker, mem.count_rng_states(tracker):
        tracker.mark(_local(existing), "engine")
        tracker.mark(_local(model.buffers()), "buffers")
        tracker.mark(_local(model.parameters()), "parameters")
        tracker.mark(_local(mem.optimizer_state_tensors(inner)), "optimizer_states")
        for name in _MASTER:
            tracker.mark(getattr(optimizer, name, None) or [], "master")
        tracking.append(tracker)
        step()
    parts = tracker.parts()
    results = [None] * world
    dist.all_gather_object(results, {"peak": tracker.peak, "phase": tracker.peak_phase,
                                     "parts": parts})  # fmt: skip
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    leave_ranks()


def _name(tracking: list[Any], keys: set[int], category: str) -> None:
    """Name the tracked storages among ``keys`` that nothing named before (the step made them)."""
    if tracking:
        live = tracking[0].live
        tracking[0].mark_keys([k for k in keys if k in live and live[k].category == "temporaries"],
                              category)  # fmt: skip


def _local(tensors: Any) -> list[Any]:
    """FSDP2's DTensors as their local shards (the storage a rank holds)."""
    from torch.distributed.tensor import DTensor

    return [t._local_tensor if isinstance(t, DTensor) else t for t in tensors]


def _tracker_class() -> Any:
    from autotune.runtime._memory import LiveTensorTracker

    class PhaseTracker(LiveTensorTracker):
        """The live-tensor tracker, also noting the phase of the step its peak fell in."""

        def __init__(self, device: Any, phase: list[str]) -> None:
            super().__init__(device)
            self.phase, self.peak_phase = phase, ""

        def _grow(self, nbytes: int) -> None:
            before = self.peak
            super()._grow(nbytes)
            if self.peak > before:
                self.peak_phase = self.phase[0]

        def parts(self) -> dict[str, int]:
            snapshot = list(self.live.values()) if self._at_peak else self.peak_snapshot
            found: dict[str, int] = {}
            for record in snapshot:
                found[record.category] = found.get(record.category, 0) + record.nbytes
            return found

    return PhaseTracker


def _PhaseTracker(device: Any, phase: list[str]) -> Any:  # noqa: N802 - a deferred class
    return _tracker_class()(device, phase)


def _measure(model: str, plan: Any, nproc: int, work: Path) -> list[dict[str, Any]]:
    job, out = work / "job.json", work / "out.json"
    job.write_text(json.dumps({"model": model, "plan": plan.model_dump_json()}))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", f"--log-dir={work / 'torchrun'}", __file__,
               "--rank-worker", str(job), str(out)]  # fmt: skip
    if not _run_ranks(command, _DEADLINE_S) or not out.exists():
        raise SystemExit(f"{plan.describe()}: rank job failed (its error above)")
    return json.loads(out.read_text())


def _facts(model: str, profile_batch: int, precisions: set[str]) -> tuple[Any, Any]:
    """The fp32 profile's facts (16-bit activations by formula), and the same with them traced."""
    from autotune.estimator import facts_from_profile, with_activations
    from autotune.runtime.profiler import profile
    from autotune.runtime.trace import traced_activations

    record = profile(model, batch_size=profile_batch, steps=2, warmup=1, device="cpu")
    formula = facts_from_profile(record)
    missing = tuple(sorted(p for p in precisions if p not in formula.activations))
    traced = with_activations(formula, traced_activations(model, missing)) if missing else formula
    return formula, traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument("--profile-batch", type=int, default=2)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    from autotune.estimator import estimate_plan
    from autotune.records import parse_plan

    started = time.time()
    plans = [parse_plan(f"{text},nproc_per_node={args.nproc_per_node}") for text in args.plans]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bf16-peaks-") as directory:
        work = Path(directory)
        model = model_path(args, work)
        formula, traced = _facts(model, args.profile_batch, {p.precision for p in plans})
        for plan in plans:
            old, new = estimate_plan(formula, plan).memory, estimate_plan(traced, plan).memory
            ranks = _measure(model, plan, args.nproc_per_node, work)
            rows.append((plan, old, new, ranks))
    name = args.hf_config or Path(args.model).name
    print(f"model {name}: {formula.parameters:,} parameters; fp32 profile at micro-batch "
          f"{args.profile_batch}; {args.nproc_per_node} ranks (MiB)")  # fmt: skip
    print("\n| plan | rank | measured peak (phase) | by formula | traced | measured at its peak |")
    print("|---|---|---|---|---|---|")
    for plan, old, new, ranks in rows:
        for rank, found in enumerate(ranks):
            peak = found["peak"]
            parts = ", ".join(f"{c} {found['parts'][c] / MIB:.2f}"
                              for c in _SHOWN if found["parts"].get(c))  # fmt: skip
            print(f"| {plan.describe()} | {rank} | {peak / MIB:.2f} ({found['phase']}) "
                  f"| {old.peak / MIB:.2f} ({100 * (old.peak / peak - 1):+.1f} %) "
                  f"| {new.peak / MIB:.2f} ({100 * (new.peak / peak - 1):+.1f} %) | {parts} |")  # fmt: skip
    print("\npredicted (traced) by category, at the predicted moment:")
    for plan, _, new, _ in rows:
        sizes = {k: v for k, v in new.model_dump().items() if isinstance(v, int) and v}
        print(f"- {plan.describe()}: " + ", ".join(f"{k} {v / MIB:.2f}" for k, v in sizes.items())
              + f"; {new.peak_composition}")  # fmt: skip
    worst = max((abs(new.peak / r["peak"] - 1), plan.describe()) for plan, _, new, rs in rows
                for r in rs)  # fmt: skip
    print(f"\nworst traced prediction vs measured: {100 * worst[0]:.1f} % ({worst[1]})")
    print(f"{len(plans)} plans in {time.time() - started:.0f} s; command: {' '.join(sys.argv)}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{"plan": p.describe(), "formula": o.peak, "traced": n.peak, "ranks": r}
             for p, o, n, r in rows]))  # fmt: skip


if __name__ == "__main__" and not rank_job(rank_main):
    main()
