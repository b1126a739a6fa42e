"""What every trial worker shares: the memory guard, the step loop that measures until the median
is known, the model file imported once per process, and the peak measures."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

import psutil

from autotune.records import (
    GUARD_EXIT,
    TrialResult,
    WorkerSpec,
    median_interval,
    relative_half_width,
)

_T = TypeVar("_T")


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
                os._exit(GUARD_EXIT)

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


def ranks() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def tensors_on(device: Any, *, collect: bool = True) -> list[Any]:
    """Every tensor object alive in this process on ``device``'s type (a gc walk).

    ``collect``: collect cyclic garbage first (a full collection, 0.1-0.3 s in a trial's
    process). Where the walk precedes a tracked step, that garbage is not alive, and a
    collection during the step would free it there, after it had been counted from the
    step's start."""
    import gc
    import warnings

    import torch

    if collect:
        gc.collect()
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


@contextlib.contextmanager
def _tracking(device: Any, existing: Iterable[Any]) -> Iterator[Any]:
    """The live-tensor tracker on ``device``, ``existing`` tensors marked, RNG states counted."""
    from autotune.runtime._memory import LiveTensorTracker, count_rng_states

    tracker = LiveTensorTracker(device)
    with tracker, count_rng_states(tracker):
        tracker.mark(existing, "existing")
        yield tracker


def live_peak(device: Any, existing: Iterable[Any], step: Callable[[], object]) -> int:
    """Most live tensor bytes on ``device`` during ``step()``, ``existing`` tensors included.

    The same measure as ``autotune profile``'s ``cpu_live_tensors`` peak
    (:class:`~autotune.runtime._memory.LiveTensorTracker`). The dispatch mode
    slows every op, so callers run it on a step that is not timed.
    """
    with _tracking(device, existing) as tracker:
        step()
    return int(tracker.peak)


def steady_peak(device: Any, step: Callable[[], _T]) -> tuple[_T, int]:
    """``step()``'s value, and the live-tensor peak on ``device`` of a later step like it, where
    this is a run's first: every tensor alive before it is marked, and those alive after it that
    were not (lazily made optimizer states, gradient buffers kept between steps, whether or not
    an op the tracker saw made them: ``torch.tensor`` does not dispatch one) are counted from
    its start (:meth:`~autotune.runtime._memory.LiveTensorTracker.steady_peak`)."""
    with _tracking(device, tensors_on(device)) as tracker:
        tracker.begin()
        value = step()
        # No collection here: a cycle the step made and left is counted as kept, as in the
        # runs bench/peak_step.py held to the extra step (and a trial pays one collection).
        tracker.mark(tensors_on(device, collect=False), "kept")
    return value, int(tracker.steady_peak())


class Steps:
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
        self.peak: int | None = None
        """The live-tensor peak of a steady step, derived from the warm-up step (``None``: the
        warm-up was not tracked; see :meth:`run`)."""

    def run(self, step: Callable[[], tuple[float, float]], peak_on: Any = None) -> None:
        """Warm up, then measure. ``peak_on``: a CPU device whose live tensors the first warm-up
        step tracks (where the settings ask for a peak from it), giving :attr:`peak` without a
        step more: the storages it allocated and kept (lazily made optimizer states, gradient
        buffers) are counted from its start, as in every later step."""
        settings = self.spec.settings
        self.first_step_at = time.time()
        start = time.perf_counter()
        measure_start = start
        index = 0
        while True:
            if index == 0 and self._tracks_warmup(peak_on):
                (seconds, loss), self.peak = steady_peak(peak_on, step)
            else:
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
            if agree(self._enough(time.perf_counter() - measure_start)):
                break
        self.steps_s = time.perf_counter() - start

    def _tracks_warmup(self, device: Any) -> bool:
        settings = self.spec.settings
        return (device is not None and device.type == "cpu" and settings.measure_peak
                and settings.peak_step == "warmup" and settings.warmup >= 1)  # fmt: skip

    def done(self, measuring_s: float) -> bool:
        """Whether the measured steps so far are enough (the rule :meth:`run` follows);
        ``measuring_s``: seconds since the first measured step began."""
        return self._enough(measuring_s)

    def _enough(self, measuring_s: float) -> bool:
        """Fixed count without a width; else until the median is known, a cap is hit, or (after
        ``steps``) the median's interval lies above ``stop_slower_than_s``."""
        settings, count = self.spec.settings, len(self.times)
        if settings.interval_width is None:
            return count >= settings.steps
        if count >= settings.max_steps or measuring_s >= settings.max_measure_s:
            return True
        if count >= settings.steps and self.behind(settings.stop_slower_than_s):
            return True
        width = relative_half_width(self.times)
        return count >= settings.steps and width is not None and width <= settings.interval_width

    def behind(self, seconds: float | None) -> bool:
        """Whether the median step time's interval lies wholly above ``seconds``."""
        return seconds is not None and bool(self.times) and median_interval(self.times)[0] > seconds

    @property
    def interval(self) -> tuple[float, float] | None:
        """The median step time's interval (``None`` before any measured step)."""
        return median_interval(self.times) if self.times else None


def agree(done: bool) -> bool:
    """Rank 0's decision for every rank: ranks that stop at different steps would deadlock."""
    if ranks()[1] == 1:
        return done
    import torch.distributed as dist

    if not dist.is_initialized():
        return done
    decision = [done]
    dist.broadcast_object_list(decision, src=0)  # works over gloo and NCCL alike
    return bool(decision[0])


def cuda_peak(device: Any) -> int | None:
    """``torch.cuda.max_memory_allocated`` so far on a CUDA device, else ``None``."""
    from autotune.runtime import _device as dev

    peaks = dev.allocator_peak(device)
    return None if peaks is None else peaks[0]


def shut_down() -> None:
    """Leave the process group together: a rank that exits with gloo's threads still running
    can abort ("terminate called without an active exception") after a trial that succeeded."""
    import torch.distributed as dist

    if ranks()[1] > 1 and dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def leave_ranks() -> NoReturn:
    """:func:`shut_down`, then exit 0 without the interpreter's teardown: DeepSpeed's gloo
    threads can still be joinable when its static destructors run, and abort a rank that
    finished (SIGABRT, "terminate called without an active exception"; 3 runs in 16 of
    ``bench/bf16_peaks.py``'s first rank job on this host, stop 50). For rank jobs whose results
    are written: nothing runs after this."""
    shut_down()
    exit_now(0)


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, then exit with ``code`` without the interpreter's teardown
    (where torch and DeepSpeed are loaded it took 2.3 s of a pooled rank's exit on this host,
    after the last result was written, and its static destructors are where gloo's threads
    abort). For a rank's program entry only: nothing runs after this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
