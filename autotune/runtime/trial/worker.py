"""Child entry of one trial: read a spec, run the plan for a few steps, write the result file."""

from __future__ import annotations

import os
import statistics
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autotune.records import StepSplit, TrialResult, WorkerSpec, read_record, write_record
from autotune.runtime.trial.deepspeed_engine import deepspeed_trial, warm_launcher
from autotune.runtime.trial.lifeline import die_with_parent
from autotune.runtime.trial.steps import (
    MemoryWatch,
    Steps,
    cuda_peak,
    exit_now,
    live_peak,
    load_cached,
    ranks,
    shut_down,
    tensors_on,
)

__all__ = ["MemoryWatch", "main", "run_trial"]


def _torch_trial(spec: WorkerSpec, steps: Steps) -> dict[str, Any]:
    from autotune.runtime._step import runner_for_plan
    from autotune.runtime.profiler import tracked_step

    plan = spec.plan
    model_file = load_cached(spec.settings.model_file)
    steps.watch.rebase()
    runner = runner_for_plan(model_file, plan, device=spec.settings.device, seed=spec.settings.seed)
    timings = []

    def step() -> tuple[float, float]:
        timing = runner.step()
        timings.append(timing)
        return timing.total, timing.loss

    try:
        steps.run(step)
        cuda = cuda_peak(runner.device)  # the timed steps' figure, read before tracking
        live: int | None = None
        source = "cpu_live_tensors"
        try:
            if spec.settings.measure_peak and cuda is None:
                # The profile's own tracked step and measure (on CPU, c10's allocator over a
                # plain step); a GPU's allocator gave the timed steps' peak already.
                tracked = tracked_step(runner).peak
                live, source = tracked.peak, tracked.source
        except Exception as exc:  # e.g. a compiled model the dispatch mode cannot follow
            sys.stderr.write(f"autotune: live tensors not tracked ({type(exc).__name__}: {exc})\n")
    finally:
        runner.close()
    measured = timings[spec.settings.warmup :]
    split = StepSplit(
        dataloader=statistics.median(t.dataloader for t in measured),
        forward=statistics.median(t.forward for t in measured),
        backward=statistics.median(t.backward for t in measured),
        optimizer=statistics.median(t.optimizer for t in measured),
    )
    tokens = model_file.tokens_per_sample(runner.last_batch)
    return {"split": split, "tokens": tokens, "device": runner.device, "engine": "torch",
            "live": live, "live_source": source, "cuda": cuda}  # fmt: skip


def _peaks(info: dict[str, Any], watch: MemoryWatch, measured: bool = True) -> dict[str, Any]:
    """Per-rank peaks: the judged one and its source, live tensor bytes, RSS growth; where the
    peak was not measured (``measured`` false) only a GPU's allocator peak is judged."""
    mine = (info["cuda"], info["live"], watch.peak_delta())
    world = ranks()[1]
    gathered: list[Any] = [mine]
    if world > 1:
        import torch.distributed as dist

        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    cuda, live, rss = ([rank[i] for rank in gathered] for i in range(3))
    if None not in cuda:
        peak, source = cuda, "cuda_max_allocated"
    elif None not in live:
        peak, source = live, info.get("live_source", "cpu_live_tensors")
    elif not measured:
        peak, source = [], None
    else:  # not comparable with the estimate; labelled so
        peak, source = rss, "cpu_rss_delta"
    return {"peak_memory_bytes": peak, "peak_source": source, "rss_delta_bytes": rss,
            "live_tensor_bytes": live if None not in live else []}  # fmt: skip


def run_trial(
    spec: WorkerSpec, watch: MemoryWatch, write: Callable[[TrialResult], None],
    *, reused: bool = False,
) -> TrialResult:  # fmt: skip
    """Run the spec's plan (plain torch, or a DeepSpeed engine) and measure it.

    ``reused``: this process ran a trial before (its peaks are reset first).
    """
    plan, settings = spec.plan, spec.settings
    if spec.warmup_only:
        return warm_launcher(spec)
    _reset_device_peaks()
    watch.limit = settings.memory_guard
    steps = Steps(spec, write, watch)
    use_deepspeed = plan.uses_deepspeed or ranks()[1] > 1
    trial = deepspeed_trial if use_deepspeed else _torch_trial
    info = (_fsdp2_trial if plan.engine == "fsdp2" else trial)(spec, steps)
    from autotune.runtime.link import trial_link  # torch.distributed: only where a trial runs
    from autotune.runtime.trial.engine_cost import with_engine_costs

    link = (settings.known_link or trial_link()) if settings.sweep_link else None
    if link is not None:  # the engines' own costs, against the link the time model will use
        link = with_engine_costs(link, settings.engine_costs, info.get("parameters"))
    peaks = _peaks(info, watch, settings.measure_peak)
    step_time = statistics.median(steps.times)
    samples = plan.global_batch / step_time
    tokens = info["tokens"]
    return TrialResult(
        completed_steps=len(steps.losses),
        samples_per_s=samples,
        tokens_per_s=samples * tokens if tokens else None,
        step_time=step_time,
        step_times=steps.times,
        step_interval=steps.interval,
        split=info["split"],
        **peaks,
        device_memory=settings.device_memory,
        loss_first=steps.losses[0],
        loss_last=steps.losses[-1],
        engine=info["engine"],
        link=link,
        first_step_at=steps.first_step_at,
        steps_s=steps.steps_s,
        reused=reused,
    )


def _fsdp2_trial(spec: WorkerSpec, steps: Steps) -> dict[str, Any]:
    from autotune.runtime.trial.fsdp2 import fsdp2_trial

    def peak(device: Any, step: Callable[[], object]) -> int | None:
        return live_peak(device, tensors_on(device), step) if spec.settings.measure_peak else None

    return fsdp2_trial(spec, steps, peak)


def _reset_device_peaks() -> None:
    """A worker reused from an earlier trial starts its CUDA peak from here."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _iter_lines(exc: BaseException) -> Iterator[str]:
    yield from traceback.format_exception(exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.runtime.trial.worker SPEC.json``: exit 0 with a result file, else 1
    (run as a program, without the interpreter's teardown: :func:`exit_now`)."""
    die_with_parent()  # a rank under torchrun: die with torchrun, which dies with tune
    args = sys.argv[1:] if argv is None else argv
    spec = read_record(args[0], WorkerSpec, "trial spec")
    # Local rank 0 of every node writes: a trial over nodes leaves its result on each node's
    # disk (c10d's rendezvous orders ranks by host, so global rank 0 may be on any node).
    writer = int(os.environ.get("LOCAL_RANK", "0")) == 0
    result_path = Path(spec.result_path)

    def write(result: TrialResult) -> None:
        if writer:
            write_record(result_path, result)

    watch = MemoryWatch(spec.settings.memory_guard)
    try:
        result = run_trial(spec, watch, write)
    except Exception as exc:
        sys.stderr.writelines(_iter_lines(exc))
        write(
            TrialResult(
                error=f"{type(exc).__name__}: {exc}", device_memory=spec.settings.device_memory
            )
        )
        return 1
    finally:
        watch.stop()
    write(result)
    shut_down()
    return 0


if __name__ == "__main__":
    # A result is written either way (on 0 the group is left already): a rank that aborted in
    # the interpreter's teardown would fail a launch that measured.
    exit_now(main())
