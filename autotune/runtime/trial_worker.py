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

from autotune.records import median_interval, read_record, relative_half_width, write_record
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


_LOADED: dict[tuple[str, int, int], Any] = {}


def load_cached(path: str) -> Any:
    """The model file, imported once per process and version of the file.

    A worker that runs many trials must not import the file again per trial: each import
    is a new module with its own globals, which a fresh worker would hold only once.
    """
    from autotune.runtime.modelfile import load_model_file

    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_model_file(path)
    return _LOADED[key]


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
    from autotune.runtime.memory import LiveTensorTracker

    tracker = LiveTensorTracker(device)
    with tracker:
        tracker.mark(existing, "existing")
        step()
    return tracker.peak


class _Steps:
    """The common step loop: warm-up, measured steps until the median is known, a progress
    result after step one, and when the first step began (the end of the trial's fixed cost).
    """

    def __init__(
        self, spec: WorkerSpec, write: Callable[[TrialResult], None], watch: MemoryWatch
    ) -> None:
        self.spec = spec
        self.watch = watch
        self.write = write
        self.times: list[float] = []
        self.losses: list[float] = []
        self.first_step_at: float | None = None
        self.steps_s: float | None = None

    def run(self, step: Callable[[], tuple[float, float]]) -> None:
        settings = self.spec.settings
        self.first_step_at = time.time()
        start = time.perf_counter()
        measure_start = start
        index = 0
        while True:
            seconds, loss = step()
            self.losses.append(loss)
            if index == 0:
                # Marks the launch as started: a later failure is the plan's, not the port's.
                self.write(TrialResult(completed_steps=1, loss_first=loss))
            index += 1
            if index <= settings.warmup:
                measure_start = time.perf_counter()
                continue
            self.times.append(seconds)
            if _agree(self._enough(time.perf_counter() - measure_start)):
                break
        self.steps_s = time.perf_counter() - start

    def _enough(self, measuring_s: float) -> bool:
        """Fixed count without a width; else until the median is known or a cap is hit."""
        settings, count = self.spec.settings, len(self.times)
        if settings.interval_width is None:
            return count >= settings.steps
        if count >= settings.max_steps or measuring_s >= settings.max_measure_s:
            return True
        width = relative_half_width(self.times)
        return count >= settings.steps and width is not None and width <= settings.interval_width

    @property
    def interval(self) -> tuple[float, float] | None:
        """The median step time's interval (``None`` before any measured step)."""
        return median_interval(self.times) if self.times else None


def _agree(done: bool) -> bool:
    """Rank 0's decision for every rank: ranks that stop at different steps would deadlock."""
    if _rank()[1] == 1:
        return done
    import torch.distributed as dist

    if not dist.is_initialized():
        return done
    decision = [done]
    dist.broadcast_object_list(decision, src=0)  # works over gloo and NCCL alike
    return bool(decision[0])


def _torch_trial(spec: WorkerSpec, steps: _Steps) -> dict[str, Any]:
    from autotune.runtime.memory import optimizer_state_tensors
    from autotune.runtime.step import runner_for_plan

    plan = spec.plan
    model_file = load_cached(spec.settings.model_file)
    steps.watch.rebase()
    runner = runner_for_plan(model_file, plan, device=spec.settings.device, seed=spec.settings.seed)
    timings = []

    def step() -> tuple[float, float]:
        timing = runner.step()
        timings.append(timing)
        return timing.total, timing.loss

    def tracked() -> None:
        for _ in runner.micro_batches():
            loss = runner.forward(runner.next_batch())
            runner.backward(loss)
            del loss
        runner.optimizer_step()

    try:
        steps.run(step)
        cuda_peak = _cuda_peak(runner.device)  # the timed steps' figure, read before tracking
        model, optimizer = runner.model, runner.optimizer
        # What track_peak (the profiler's tracked step) counts as present at the start.
        existing = [*model.parameters(), *model.buffers(), *_grads(model),
                    *optimizer_state_tensors(optimizer)]  # fmt: skip
        live: int | None = None
        try:
            live = _live_peak(runner.device, existing, tracked)
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


def _grads(model: Any) -> list[Any]:
    return [p.grad for p in model.parameters() if p.grad is not None]


def _cuda_peak(device: Any) -> int | None:
    """``torch.cuda.max_memory_allocated`` so far on a CUDA device, else ``None``."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    return int(torch.cuda.max_memory_allocated(device))


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

    plan = spec.plan
    model_file = load_cached(spec.settings.model_file)
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
    device = engine.device
    batches.close()
    _forget(engine, model)
    return {"split": None, "tokens": tokens, "device": device, "engine": "deepspeed",
            "live": live, "cuda": cuda_peak}  # fmt: skip


def _forget(engine: Any, model: Any) -> None:
    """Drop every reference DeepSpeed keeps to a finished engine, so a worker that runs
    the next trial holds none of this one's tensors (its peak would count them).
    """
    with contextlib.suppress(Exception):
        engine.destroy()  # hooks, ZeRO partitions
    # ZeRO-3 puts the top module on a module-level stack it never pops (DeepSpeed 0.19).
    from deepspeed.runtime.zero import parameter_offload

    stack = getattr(parameter_offload, "FWD_MODULE_STACK", None)
    if isinstance(stack, list):
        stack[:] = [module for module in stack if module is not model]
    # ... and caches a method per coordinator instance in a class-level lru_cache.
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator

    for value in vars(coordinator.PartitionedParameterCoordinator).values():
        _clear_caches(value)


def _clear_caches(fn: Any, depth: int = 3) -> None:
    """``cache_clear()`` every lru_cache inside ``fn``'s wrappers (``__wrapped__`` or closures)."""
    if depth < 0 or fn is None:
        return
    clear = getattr(fn, "cache_clear", None)
    if callable(clear):
        clear()
    inner = [getattr(fn, "__wrapped__", None)]
    inner += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
              if callable(getattr(cell, "cell_contents", None))]  # fmt: skip
    for wrapped in inner:
        _clear_caches(wrapped, depth - 1)


def _warm_launcher(spec: WorkerSpec) -> TrialResult:
    """Start DeepSpeed once on a throw-away model: compiles and caches its comm op.

    A plan that needs no DeepSpeed only imports torch (a live worker keeps it imported).
    """
    import torch

    world = _rank()[1]
    if not (spec.plan.uses_deepspeed or world > 1):
        return TrialResult(engine="none")
    import deepspeed

    model = torch.nn.Linear(4, 4)
    config = {
        "train_batch_size": world,
        "train_micro_batch_size_per_gpu": 1,
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    _forget(engine, model)
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
    spec: WorkerSpec, watch: MemoryWatch, write: Callable[[TrialResult], None],
    *, reused: bool = False,
) -> TrialResult:  # fmt: skip
    """Run the spec's plan (plain torch, or a DeepSpeed engine) and measure it.

    ``reused``: this process ran a trial before (its peaks are reset first).
    """
    plan, settings = spec.plan, spec.settings
    if spec.warmup_only:
        return _warm_launcher(spec)
    _reset_device_peaks()
    watch.limit = settings.memory_guard
    steps = _Steps(spec, write, watch)
    use_deepspeed = plan.uses_deepspeed or _rank()[1] > 1
    info = (_deepspeed_trial if use_deepspeed else _torch_trial)(spec, steps)
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
        step_interval=steps.interval,
        split=info["split"],
        **peaks,
        device_memory=settings.device_memory,
        loss_first=steps.losses[0],
        loss_last=steps.losses[-1],
        engine=info["engine"],
        first_step_at=steps.first_step_at,
        steps_s=steps.steps_s,
        reused=reused,
    )


def _reset_device_peaks() -> None:
    """A worker reused from an earlier trial starts its CUDA peak from here."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _iter_lines(exc: BaseException) -> Iterator[str]:
    yield from traceback.format_exception(exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.runtime.trial_worker SPEC.json``: exit 0 with a result file, else 1."""
    args = sys.argv[1:] if argv is None else argv
    spec = read_record(args[0], WorkerSpec, "trial spec")
    rank = _rank()[0]
    result_path = Path(spec.result_path)

    def write(result: TrialResult) -> None:
        if rank == 0:
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
