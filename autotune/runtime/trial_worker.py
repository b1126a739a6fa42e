"""Child entry of one trial: read a spec, run the plan for a few steps, write the result file."""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

from autotune.records import read_record, write_record
from autotune.runtime.lifeline import die_with_parent
from autotune.search import StepSplit, TrialResult, WorkerSpec


class MemoryWatch:
    """Samples this process's RSS in a thread: a guard, and RSS growth as an extra figure.

    Above ``limit`` bytes the worker stops itself at once with a line the outcome
    classifier reads as out-of-memory, long before the kernel's OOM killer would
    pick a victim on a shared machine.
    """

    def __init__(self, limit: int | None, interval_s: float = 0.01) -> None:
        self.process = psutil.Process()
        self.base = self.process.memory_info().rss
        self.peak = self.base
        self.limit = limit
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="autotune-memory-watch", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            rss = self.process.memory_info().rss
            self.peak = max(self.peak, rss)
            if self.limit is not None and rss > self.limit:
                sys.stderr.write(f"autotune memory guard: RSS {rss} B > limit {self.limit} B\n")
                sys.stderr.flush()
                os._exit(3)

    def rebase(self) -> None:
        """Measure from here: the model file's own imports are not the plan's memory."""
        self.base = self.peak = self.process.memory_info().rss
        resource_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self._maxrss_at_base = resource_peak

    def peak_delta(self) -> int:
        """Peak RSS above the RSS before the model was built (bytes)."""
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        # ru_maxrss only counts if it rose after the base (imports may have peaked higher).
        grew = max_rss if max_rss > getattr(self, "_maxrss_at_base", 0) else 0
        return max(self.peak, grew) - self.base

    def stop(self) -> None:
        """End the sampling thread."""
        self._stop.set()


def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def _cast_floats(batch: Any, dtype: Any) -> Any:
    """16-bit-weight engines need floating inputs in the weights' dtype."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {key: _cast_floats(value, dtype) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_cast_floats(value, dtype) for value in batch)
    return batch


def _live_peak(device: Any, existing: Iterable[Any], step: Callable[[], object]) -> int:
    """Most live tensor bytes on ``device`` during ``step()``, ``existing`` tensors included.

    The same measure as ``autotune profile``'s ``cpu_live_tensors`` peak
    (:class:`~autotune.runtime.memory.LiveTensorTracker`). The dispatch mode
    slows every op, so callers run it on one extra step that is not timed.
    """
    from autotune.runtime.memory import LiveTensorTracker, count_rng_states

    tracker = LiveTensorTracker(device)
    with tracker, count_rng_states(tracker):
        tracker.mark(existing, "existing")
        step()
    return tracker.peak


class _Steps:
    """The common step loop: warm-up, measured steps, a progress result after step one."""

    def __init__(
        self, spec: WorkerSpec, write: Callable[[TrialResult], None], watch: MemoryWatch
    ) -> None:
        self.spec = spec
        self.watch = watch
        self.write = write
        self.times: list[float] = []
        self.losses: list[float] = []

    def run(self, step: Callable[[], tuple[float, float]]) -> None:
        settings = self.spec.settings
        for index in range(settings.warmup + settings.steps):
            seconds, loss = step()
            self.losses.append(loss)
            if index >= settings.warmup:
                self.times.append(seconds)
            if index == 0:
                # Marks the launch as started: a later failure is the plan's, not the port's.
                self.write(TrialResult(completed_steps=1, loss_first=loss))


def _torch_trial(spec: WorkerSpec, steps: _Steps) -> dict[str, Any]:
    from autotune.runtime.modelfile import load_model_file
    from autotune.runtime.profiler import tracked_step
    from autotune.runtime.step import runner_for_plan

    plan = spec.plan
    model_file = load_model_file(spec.settings.model_file)
    steps.watch.rebase()
    runner = runner_for_plan(model_file, plan, device=spec.settings.device, seed=spec.settings.seed)
    timings = []

    def step() -> tuple[float, float]:
        timing = runner.step()
        timings.append(timing)
        return timing.total, timing.loss

    try:
        steps.run(step)
        cuda_peak = _cuda_peak(runner.device)  # the timed steps' figure, read before tracking
        live: int | None = None
        try:
            # The profile's own tracked step: the same measure as its cpu_live_tensors peak.
            live = tracked_step(runner).peak.peak
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
            "live": live, "cuda": cuda_peak}  # fmt: skip


def _cuda_peak(device: Any) -> int | None:
    """``torch.cuda.max_memory_allocated`` so far on a CUDA device, else ``None``."""
    from autotune.runtime import device as dev

    peaks = dev.allocator_peak(device)
    return None if peaks is None else peaks[0]


def _tensors_on(device: Any) -> list[Any]:
    """Every tensor object alive in this process on ``device``'s type (a gc walk)."""
    import gc
    import warnings

    import torch

    found = []
    with warnings.catch_warnings():  # isinstance on deprecated module proxies warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device.type == device.type:
                    found.append(obj)
            except Exception:  # proxies and half-built objects: not tensors we can size
                continue
    return found


def _deepspeed_trial(spec: WorkerSpec, steps: _Steps) -> dict[str, Any]:
    import deepspeed
    import torch

    from autotune.emit import emit_deepspeed_config
    from autotune.runtime.blocks import apply_checkpointing
    from autotune.runtime.device import synchronize
    from autotune.runtime.modelfile import load_model_file

    plan = spec.plan
    model_file = load_model_file(spec.settings.model_file)
    steps.watch.rebase()
    torch.manual_seed(spec.settings.seed)
    model = model_file.build_model()
    apply_checkpointing(model, plan.checkpoint_blocks)
    optimizer = model_file.build_optimizer([p for p in model.parameters() if p.requires_grad])
    parameters = sum(p.numel() for p in model.parameters())
    # deepspeed.initialize parses it with DeepSpeed's own config class just below.
    config = emit_deepspeed_config(plan, world_size=_rank()[1], parameters=parameters).config
    # A torch client optimizer avoids compiling DeepSpeed's own (60-75 s per trial shape).
    config["zero_allow_untested_optimizer"] = True
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    batches = model_file.batches(plan.micro_batch, workers=plan.dataloader_workers or None)
    weights = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    amp = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(plan.precision)
    last: list[Any] = [None]

    def micro() -> float:
        batch = next(batches)
        last[0] = batch
        batch = model_file.move(batch, engine.device)
        if weights is not None:
            batch = _cast_floats(batch, weights)
        autocast = (
            torch.autocast(engine.device.type, dtype=amp) if amp else contextlib.nullcontext()
        )
        with autocast:
            loss = model_file.loss(engine, batch)
        engine.backward(loss)
        engine.step()
        return float(loss.detach().float())

    def step() -> tuple[float, float]:
        start = time.perf_counter()
        loss = sum(micro() for _ in range(plan.grad_accum)) / plan.grad_accum
        synchronize(engine.device)
        return time.perf_counter() - start, loss

    steps.run(step)
    cuda_peak = _cuda_peak(engine.device)
    # The engine's flat buffers and partitions are not all reachable from the model or
    # the optimizer, so everything alive on the device counts as present at the start.
    live = _live_peak(engine.device, _tensors_on(engine.device), step)
    tokens = model_file.tokens_per_sample(last[0])
    return {"split": None, "tokens": tokens, "device": engine.device, "engine": "deepspeed",
            "live": live, "cuda": cuda_peak}  # fmt: skip


def _fsdp2_trial(spec: WorkerSpec, steps: _Steps) -> dict[str, Any]:
    from autotune.runtime.fsdp import fsdp2_trial

    return fsdp2_trial(
        spec, steps, lambda device, step: _live_peak(device, _tensors_on(device), step)
    )


def _warm_launcher(spec: WorkerSpec) -> TrialResult:
    """Start DeepSpeed once on a throw-away model: compiles and caches its comm op."""
    import deepspeed
    import torch

    world = _rank()[1]
    model = torch.nn.Linear(4, 4)
    config = {
        "train_batch_size": world,
        "train_micro_batch_size_per_gpu": 1,
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return TrialResult(engine="deepspeed")


def _peaks(info: dict[str, Any], watch: MemoryWatch) -> dict[str, Any]:
    """Per-rank peaks: the judged one and its source, live tensor bytes, RSS growth."""
    mine = (info["cuda"], info["live"], watch.peak_delta())
    world = _rank()[1]
    gathered: list[Any] = [mine]
    if world > 1:
        import torch.distributed as dist

        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    cuda, live, rss = ([rank[i] for rank in gathered] for i in range(3))
    if None not in cuda:
        peak, source = cuda, "cuda_max_allocated"
    elif None not in live:
        peak, source = live, "cpu_live_tensors"
    else:  # not comparable with the estimate; labelled so
        peak, source = rss, "cpu_rss_delta"
    return {"peak_memory_bytes": peak, "peak_source": source, "rss_delta_bytes": rss,
            "live_tensor_bytes": live if None not in live else []}  # fmt: skip


def run_trial(
    spec: WorkerSpec, watch: MemoryWatch, write: Callable[[TrialResult], None]
) -> TrialResult:
    """Run the spec's plan (plain torch, or a DeepSpeed engine) and measure it."""
    plan, settings = spec.plan, spec.settings
    if spec.warmup_only:
        return _warm_launcher(spec)
    steps = _Steps(spec, write, watch)
    use_deepspeed = plan.uses_deepspeed or _rank()[1] > 1
    trial = _deepspeed_trial if use_deepspeed else _torch_trial
    info = (_fsdp2_trial if plan.engine == "fsdp2" else trial)(spec, steps)
    peaks = _peaks(info, watch)
    step_time = statistics.median(steps.times)
    samples = plan.global_batch / step_time
    tokens = info["tokens"]
    return TrialResult(
        completed_steps=len(steps.losses),
        samples_per_s=samples,
        tokens_per_s=samples * tokens if tokens else None,
        step_time=step_time,
        step_times=steps.times,
        split=info["split"],
        **peaks,
        device_memory=settings.device_memory,
        loss_first=steps.losses[0],
        loss_last=steps.losses[-1],
        engine=info["engine"],
    )


def _iter_lines(exc: BaseException) -> Iterator[str]:
    yield from traceback.format_exception(exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.runtime.trial_worker SPEC.json``: exit 0 with a result file, else 1."""
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
