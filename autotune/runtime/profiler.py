"""``profile()``: real training steps of a model file, measured into a ProfileRecord."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._guards import detect_fake_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from autotune import __version__
from autotune.estimator import BF16_RATIO_FIGURE, bf16_ratio_problem, check_figures
from autotune.records import (
    ActivationFit,
    AtPeak,
    AutotuneError,
    BlockStack,
    Capabilities,
    Compute,
    Environment,
    MemoryBreakdown,
    ModelInfo,
    ModuleBytes,
    ProfileConfig,
    ProfileRecord,
    Provenance,
    Spread,
    StepTime,
    Throughput,
    TimedSteps,
    redact,
)
from autotune.runtime import _cpu_allocator as cpu_allocator
from autotune.runtime import _device as dev
from autotune.runtime import _host as host
from autotune.runtime import _memory as mem
from autotune.runtime._blocks import (
    BlockClock,
    apply_checkpointing,
    find_block_stack,
    unique_parameter_count,
)
from autotune.runtime._step import StepPrecision, StepTiming, TrainRunner
from autotune.runtime.modelfile import ModelFile, load_model_file

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``, called as the profile advances."""


def _attention_flops(query: Any, key: Any, value: Any, *args: Any, **kw: Any) -> int:
    """Q K^T and the scores times V: 2 FLOPs per multiply-add, every query head (grouped-query
    key/value heads are broadcast to the query's, as the kernels do)."""
    b, heads, s_q, d_q = query.shape
    s_k, d_v = key.shape[-2], value.shape[-1]
    return 2 * b * heads * s_q * s_k * (d_q + d_v)


def _attention_backward_flops(grad: Any, query: Any, key: Any, value: Any, *args: Any,
                              **kw: Any) -> int:  # fmt: skip
    """The fused backward: the scores recomputed (Q K^T), then the gradients of the scores, V, Q
    and K, one product each."""
    b, heads, s_q, d_q = query.shape
    s_k, d_v = key.shape[-2], value.shape[-1]
    return 2 * b * heads * s_q * s_k * (3 * d_q + 2 * d_v)


# FlopCounterMode has no formula for the CPU fused attention kernel (its FLOPs would vanish), and
# torch before 2.13 asserts on grouped-query shapes in its SDPA formulas (a GQA model's profile
# on a GPU failed there): every fused SDPA op is counted by the two formulas above.
_attention_flops._get_raw = True  # type: ignore[attr-defined]
_attention_backward_flops._get_raw = True  # type: ignore[attr-defined]
_SDPA_OPS = ("flash_attention_for_cpu", "flash_attention", "efficient_attention", "cudnn_attention")
_FLOP_FORMULAS = {
    getattr(torch.ops.aten, f"_scaled_dot_product_{name}{suffix}"): formula
    for name in _SDPA_OPS
    for suffix, formula in (("", _attention_flops), ("_backward", _attention_backward_flops))
    if hasattr(torch.ops.aten, f"_scaled_dot_product_{name}{suffix}")  # an op older torch lacks
}


class OutOfMemory(AutotuneError):
    """A measured step ran out of the device's memory: one line naming the micro-batch."""

    def __init__(self, model_path: str | Path, batch_size: int, what: str,
                 device: torch.device, exc: BaseException) -> None:  # fmt: skip
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        super().__init__(f"{model_path}: the step at micro-batch {batch_size} ({what}) ran out of "
                         f"{device.type} memory: profile a smaller batch ({first})")  # fmt: skip


def profile(
    model_path: str | Path,
    *,
    batch_size: int,
    steps: int = 20,
    warmup: int = 3,
    device: str = "auto",
    precision: StepPrecision = "fp32",
    checkpointing: bool = False,
    progress: Progress | None = None,
    command: str | None = None,
    label: str | None = None,
) -> ProfileRecord:
    """Measure the model file's training step: memory, time, compute, environment.

    Args:
        model_path: the model file (the contract in docs/model-file.md).
        batch_size: samples per step.
        steps: timed steps (uninstrumented) whose medians are reported.
        warmup: steps run first and dropped.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``fp32`` or an autocast dtype (``bf16``/``fp16``) with fp32 weights.
        checkpointing: checkpoint every block of the model's block stack.
        progress: called with ``(phase, done, total)``.
        command: the command line to record (default: ``sys.argv``).
        label: how the record names the model (default: the file's path); e.g.
            ``hf-config CONFIG --seq-len N`` for a generated model file.

    Raises:
        AutotuneError: a bad option or anything wrong with the model file.
    """
    return profile_and_time(model_path, batch_size=batch_size, steps=steps, warmup=warmup,
                            device=device, precision=precision, checkpointing=checkpointing,
                            progress=progress, command=command, label=label).profile  # fmt: skip


@dataclass(frozen=True)
class Profiled:
    """A profile, and the timed steps at a second micro-batch taken in the same process after
    it (``None``: none asked for, or they ran out of memory at ``out_of_memory`` samples)."""

    profile: ProfileRecord
    timed: TimedSteps | None = None
    out_of_memory: int | None = None


def profile_and_time(
    model_path: str | Path,
    *,
    batch_size: int,
    steps: int = 20,
    warmup: int = 3,
    device: str = "auto",
    precision: StepPrecision = "fp32",
    checkpointing: bool = False,
    progress: Progress | None = None,
    command: str | None = None,
    label: str | None = None,
    second_batch: Callable[[ProfileRecord], int] | None = None,
    second_steps: int = 3,
) -> Profiled:
    """:func:`profile`, then (where ``second_batch`` of the record is another micro-batch) that
    many samples' timed steps on the same model, optimizer and warm process, without the memory,
    FLOPs and probes the profile measured: ``second_steps`` steps and their medians, the first
    of them the warm-up at the new size (the median of three leaves one slow step out). They cost
    no second model build, optimizer state or first step (issue 33: 52 s of a 124M tune's 116 s
    of profiles went to the second, run on its own).

    Raises:
        AutotuneError: a bad option or anything wrong with the model file; the profile's step
            out of memory (:class:`OutOfMemory`). The second's is ``out_of_memory`` instead.
    """
    if batch_size < 1 or steps < 1 or warmup < 0:
        raise AutotuneError("--batch-size and --steps must be >= 1, --warmup >= 0")
    report = progress or (lambda phase, done, total: None)
    device_obj = dev.resolve_device(device)
    model_file = load_model_file(model_path)
    workspace = dev.blas_workspace(device_obj)  # before the model's first matmul
    runner = TrainRunner(model_file, device=device_obj, precision=precision, micro_batch=batch_size)
    config = ProfileConfig(batch_size=batch_size, precision=precision, checkpointing=checkpointing,
                           steps=steps, warmup=warmup, device=device_obj.type)  # fmt: skip
    try:
        try:
            if checkpointing:
                _checkpoint_all(runner)
            clock = BlockClock(runner.model, device_obj)
            counterpart = _Counterpart(runner, steps, clock)
            counter, ops = _flop_counter(), _OpCount()
            timings = _timed_steps(runner, steps, warmup, report, between=counterpart.run,
                                   counter=_counting(counter, ops), clock=clock)  # fmt: skip
            clock.close()
            own = timings.summary()
            bf16_over_fp32, bf16_reason = counterpart.ratio(own.forward + own.backward)
            shares = {**counterpart.block_share(), **timings.block_share(precision)}
            memory, samples_seen = _measure_memory(runner, report)
            counted = float(counter.get_total_flops()) / runner.grad_accum if warmup else None
            compute = _measure_compute(runner, checkpointing, counted)
        except (torch.OutOfMemoryError, MemoryError) as exc:
            what = f"{precision}{', every block checkpointed' if checkpointing else ''}"
            raise OutOfMemory(model_path, batch_size, what, device_obj, exc) from None
        report("environment", 0, 1)
        peak, peak_source, peak_reason = dev.peak_flops(device_obj, precision)
        environment, refused = _environment(device_obj, timings, peak_reason, workspace)
        report("environment", 1, 1)
        step_time = timings.summary().model_copy(update={
            "bf16_over_fp32": bf16_over_fp32,
            "block_forward_share": shares,
            "ops_per_micro_batch": ops.ops // runner.grad_accum if warmup else None,
            "seconds_per_op": seconds_per_op(device_obj),
        })  # fmt: skip
        if bf16_reason:
            unavailable = {**environment.unavailable, "time.bf16_over_fp32": bf16_reason}
            environment = environment.model_copy(update={"unavailable": unavailable})
        tokens = model_file.tokens_per_sample(samples_seen)
        record = ProfileRecord(
            config=config,
            model=_model_info(runner.model, tokens),
            memory=memory,
            time=step_time,
            throughput=Throughput(
                samples_per_s=batch_size / step_time.step,
                tokens_per_s=batch_size * tokens / step_time.step if tokens else None,
            ),
            compute=_utilisation(compute, step_time.step, device_obj, peak, peak_source),
            environment=environment,
            provenance=_provenance(model_file, command, label),
        )
        # An impossible MFU is kept for the record, flagged; a refused ratio is already None.
        record = record.model_copy(update={"flags": {**refused, **check_figures(record)}})
        return _with_second(record, runner, second_batch, second_steps, report)
    finally:
        runner.close()


def _with_second(record: ProfileRecord, runner: TrainRunner,
                 second_batch: Callable[[ProfileRecord], int] | None, steps: int,
                 report: Progress) -> Profiled:  # fmt: skip
    """The profile, with ``steps`` timed steps of its runner at ``second_batch(record)`` samples
    where that is another micro-batch (none dropped: the median leaves the first, slower at a
    new size, out). Where they are taken (a model whose operators' own cost may matter), the
    one-thread probe is taken first, at the profile's batch, into its ``time``."""
    batch = record.config.batch_size if second_batch is None else second_batch(record)
    if batch == record.config.batch_size:
        return Profiled(record)
    ratio = _one_thread_over_all(runner)  # at the profile's batch, before the rebatch
    if ratio is not None:
        record = record.model_copy(
            update={"time": record.time.model_copy(update={"one_thread_over_all": ratio})}
        )
    try:
        runner.rebatch(batch)
        timings = _timed_steps(runner, steps, 0, report)
    except (torch.OutOfMemoryError, MemoryError):
        return Profiled(record, None, out_of_memory=batch)
    config = record.config.model_copy(update={"batch_size": batch, "steps": steps, "warmup": 0})
    return Profiled(record, TimedSteps(config=config, time=timings.summary()))


THREAD_PAIRS = 3
"""Paired passes (one thread, then all) whose median ratio :func:`_one_thread_over_all` takes."""


def _one_thread_over_all(runner: TrainRunner) -> float | None:
    """On a CPU running on more than one thread: the model's forward and backward on one thread
    over the same on all of them, the median of :data:`THREAD_PAIRS` pairs after one pass on
    one thread (its warm-up). A rank given fewer cores than the profile had is scaled by it: a
    small model's operators gain less from threads than linearly (tiny GPT at micro-batch 1:
    1.27 times faster on 2 threads than on 1, not 2). ``None`` elsewhere."""
    threads = torch.get_num_threads()
    if runner.device.type != "cpu" or threads <= 1:
        return None

    def seconds(on: int) -> float:
        torch.set_num_threads(on)
        batch = runner.next_batch()
        start = time.perf_counter()
        runner.backward(runner.forward(batch))
        took = time.perf_counter() - start
        runner.optimizer.zero_grad(set_to_none=True)
        return took

    try:
        seconds(1)
        return statistics.median(seconds(1) / seconds(threads) for _ in range(THREAD_PAIRS))
    finally:
        torch.set_num_threads(threads)


def _checkpoint_all(runner: TrainRunner) -> None:
    found = find_block_stack(runner.model)
    if found is None:
        raise AutotuneError(
            f"--checkpointing on: {runner.model_file.path} has no repeated block stack "
            "(an nn.ModuleList of >= 2 blocks of one class) to checkpoint"
        )
    apply_checkpointing(runner.model, len(found[1]))
    runner.checkpoint_blocks = len(found[1])


class _Timings:
    """Timed steps and the NVML samples taken while they ran."""

    def __init__(self, measured: list[StepTiming], blocks: list[float] | None = None) -> None:
        self.measured = measured
        self.blocks = blocks or []  # per timed step, its block stack's forward seconds
        self.nvml: Any = None
        self.nvml_reason: str | None = None

    def block_share(self, precision: str) -> dict[str, float]:
        """``{precision: the median over the timed steps of the block stack's share of the
        forward}``, empty where the stack's time was not taken."""
        shares = [
            b / t.forward for b, t in zip(self.blocks, self.measured, strict=False) if t.forward > 0
        ]
        return {precision: min(statistics.median(shares), 1.0)} if shares else {}

    def summary(self) -> StepTime:
        totals = sorted(t.total for t in self.measured)
        quartiles = statistics.quantiles(totals, n=4) if len(totals) > 1 else [totals[0]] * 3

        def median(name: str) -> float:
            return statistics.median(getattr(t, name) for t in self.measured)

        return StepTime(
            step=median("total"),
            dataloader=median("dataloader"),
            forward=median("forward"),
            backward=median("backward"),
            optimizer=median("optimizer"),
            spread=Spread(
                min=totals[0],
                p25=quartiles[0],
                median=quartiles[1],
                p75=quartiles[2],
                max=totals[-1],
            ),
            steps_measured=len(totals),
        )


def _timed_steps(
    runner: TrainRunner, steps: int, warmup: int, report: Progress,
    between: Callable[[StepTiming | None], None] | None = None,
    counter: AbstractContextManager[Any] | None = None, clock: BlockClock | None = None,
) -> _Timings:  # fmt: skip
    """``warmup`` steps, then ``steps`` timed ones; ``between`` (where given) runs after the
    warm-up (with its last step, ``None`` where none ran) and after each timed step (with it),
    outside the steps' own timings. The first warm-up step's forward and backward passes run
    inside ``counter`` (where given): their FLOPs and operators, counted where no timing is
    kept. ``clock`` (where given and the model has a block stack) takes each timed step's
    seconds in its block stack's forward."""
    last: StepTiming | None = None
    for index in range(warmup):
        report("warm-up", index, warmup)
        last = runner.step(passes=counter if index == 0 else None)
    report("warm-up", warmup, warmup)
    if between is not None:
        between(last)
    measured: list[StepTiming] = []
    blocks: list[float] = []
    with dev.NvmlSampler(runner.device) as sampler:
        for index in range(steps):
            report("timed steps", index, steps)
            if clock is not None:
                clock.take()
            measured.append(runner.step())
            seconds = clock.take() if clock is not None else None
            if seconds is not None:
                blocks.append(seconds)
            if between is not None:
                between(measured[-1])
    report("timed steps", steps, steps)
    timings = _Timings(measured, blocks)
    timings.nvml, timings.nvml_reason = sampler.result(), sampler.reason
    return timings


_COUNTERPART: dict[str, StepPrecision] = {"fp32": "bf16", "bf16": "fp32"}
SLOW_COUNTERPART = 4.0
"""A counterpart's first forward and backward over this many times the profile's own is kept as
it is (bf16 on a CPU without bf16 units): no more are paid for."""
COUNTERPART_PAIRS = 3
"""Timed steps paired with a counterpart pass, spread over the timed steps (fewer where fewer
steps are timed)."""


class _Counterpart:
    """The model's forward and backward in bf16 autocast over fp32, measured in pairs: after
    each of :data:`COUNTERPART_PAIRS` timed steps spread over the ``steps``, one micro-batch at the
    profile's counterpart precision (bf16 autocast for an fp32 profile, fp32 for a bf16 one),
    set against that step's own forward and backward. Each pair runs seconds apart, so a slow
    phase of the host hits both of its halves; the ratio is the median over the pairs. The
    first pass, after the warm-up, is a warm-up too. What a plan at the other precision scales
    its compute by. ``clock`` takes each pass's seconds in the block stack's forward, for its
    share of the pass's forward at the other precision."""

    def __init__(self, runner: TrainRunner, steps: int, clock: BlockClock) -> None:
        self.runner = runner
        self.clock = clock
        self.shares: list[float] = []  # each paired pass's block stack's share of its forward
        self.stride = max(1, -(-steps // COUNTERPART_PAIRS))  # every stride-th timed step
        self.seen = 0  # timed steps so far
        self.other = _COUNTERPART.get(runner.precision)
        self.pairs: list[tuple[float, float]] = []  # (counterpart's seconds, the step's own)
        self.warm: tuple[float, float | None] | None = None  # the warm-up pass's, the same
        self.reason: str | None = None
        if self.other is None:
            self.reason = f"no bf16 / fp32 counterpart of a {runner.precision} profile"
        elif runner.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            self.reason = "the GPU has no bf16"

    def run(self, step: StepTiming | None) -> None:
        """One counterpart pass after ``step`` (``None``: after a warm-up of no steps) where it
        is the warm-up's or a paired timed step's."""
        if self.warm is not None:
            self.seen += 1
            if (self.seen - 1) % self.stride:
                return
        if self.reason is not None or self._slow():
            return
        passed = self._pass()
        if passed is None:
            return
        seconds, share = passed
        own = step.forward + step.backward if step is not None else None
        if self.warm is None:
            self.warm = seconds, own
        elif own:
            self.pairs.append((seconds, own))
            if share is not None:
                self.shares.append(share)

    def _slow(self) -> bool:
        """Whether the warm-up pass took over :data:`SLOW_COUNTERPART` times its step's own."""
        return bool(self.warm and self.warm[1] and self.warm[0] >= SLOW_COUNTERPART * self.warm[1])

    def _pass(self) -> tuple[float, float | None] | None:
        """The counterpart's forward and backward seconds, and its block stack's share of the
        forward (``None``: no stack); ``None`` where the pass failed."""
        runner, own_precision, clock = self.runner, self.runner.precision, self.clock
        batch = runner.next_batch()
        runner.precision = self.other  # type: ignore[assignment]  # set where not None
        try:
            clock.take()
            dev.synchronize(runner.device)
            start = time.perf_counter()
            loss = runner.forward(batch)
            dev.synchronize(runner.device)
            forward = time.perf_counter() - start
            blocks = clock.take()
            runner.backward(loss)
            dev.synchronize(runner.device)
            share = blocks / forward if blocks is not None and forward > 0 else None
            return time.perf_counter() - start, share
        except (RuntimeError, AutotuneError) as exc:  # out of memory, or a model that refuses it
            self.reason = f"the {self.other} forward and backward failed: {type(exc).__name__}"
            return None
        finally:
            runner.precision = own_precision
            runner.optimizer.zero_grad(set_to_none=True)

    def block_share(self) -> dict[str, float]:
        """``{the other precision: the median over the paired passes of the block stack's share
        of the forward}``, empty where none was taken."""
        if self.other is None or not self.shares:
            return {}
        return {self.other: min(statistics.median(self.shares), 1.0)}

    def ratio(self, compute: float) -> tuple[float | None, str | None]:
        """bf16 over fp32: the median of the pairs' ratios, or where the counterpart was too
        slow to pay for more, its warm-up pass over ``compute`` (the timed steps' median forward
        and backward); ``(None, why)`` where nothing was measured."""
        if self.reason is not None:
            return None, self.reason
        if self.pairs:
            ratio = statistics.median(seconds / own for seconds, own in self.pairs)
        elif self.warm is not None and compute > 0:
            ratio = self.warm[0] / compute
        else:
            return None, "no timed forward and backward to set the counterpart against"
        return (ratio if self.other == "bf16" else 1.0 / ratio), None


@dataclass(frozen=True)
class TrackedStep:
    """One optimizer step under the live-tensor tracker: its peak and what it saved."""

    peak: mem.PeakResult
    saved: mem.SavedTensors
    gradients: int
    backward: tuple[int, AtPeak] | None = None
    """The live-tensor peak over the backward passes alone, and its parts: the start of backward
    (the loss's gradient buffers beside the activations), where the whole step may peak later."""


def tracked_step(runner: TrainRunner) -> TrackedStep:
    """Run one optimizer step (``grad_accum`` micro-batches) with every tensor it makes tracked.

    The profile and the trials measure with it, and the estimate's trace runs the
    same step on fake tensors, so all see the same moments and temporaries. The
    saved tensors are those of the last micro-batch (they are alike). On CPU with
    real tensors one more, plain step follows under c10's allocator events
    (:func:`allocator_peak`), and the peak is that step's: allocations that are no
    tensor count, and no dispatch mode changes how autograd allocates.
    """
    step = _tensor_tracked_step(runner)
    if step.peak.source != "cpu_live_tensors" or detect_fake_mode(list(runner.model.parameters())):
        return step
    peak = mem.with_allocator_peak(step.peak, allocator_peak(runner))
    return TrackedStep(peak, step.saved, step.gradients, step.backward)


def allocator_peak(runner: TrainRunner) -> int:
    """Peak bytes of one plain CPU step as c10's allocator saw them (torch.profiler's events).

    The training state alive at the step's start (parameters, buffers, gradients,
    optimizer states), plus the most the step's own allocations held at once, plus
    a batch that came from elsewhere (DataLoader workers' shared memory).
    """
    model, optimizer = runner.model, runner.optimizer
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    start = mem.unique_bytes(
        [*model.parameters(), *model.buffers(), *grads, *mem.optimizer_state_tensors(optimizer)]
    )
    del grads
    window = cpu_allocator.watch_cpu_allocator(runner.step)
    return (
        start
        + window.peak_rise
        + cpu_allocator.untracked_batch_bytes(runner.last_batch, window.pointers)
    )


def _tensor_tracked_step(runner: TrainRunner) -> TrackedStep:
    """The step under the live-tensor tracker alone (its parts at the peak, what it saved)."""
    model, optimizer = runner.model, runner.optimizer
    with mem.track_peak(model, optimizer, runner.device) as (tracker, peak_out):
        for index, _ in enumerate(runner.micro_batches()):
            batch = runner.next_batch()
            tracker.mark_batch(batch)
            with mem.count_saved_tensors(model) as saved:
                loss = runner.forward(batch)
            for category, keys in saved.keys.items():
                tracker.mark_keys(keys, category)
            if index == 0:
                tracker.open_window()
            runner.backward(loss)
            del loss, batch
        backward = tracker.close_window()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        gradients = mem.unique_bytes(grads)
        tracker.mark(grads, "gradients")
        del grads
        runner.optimizer_step()
        tracker.mark(mem.optimizer_state_tensors(optimizer), "optimizer_states")
    return TrackedStep(peak_out[0], saved, gradients, backward)


def _measure_memory(runner: TrainRunner, report: Progress) -> tuple[MemoryBreakdown, Any]:
    """One tracked step for the states, saved tensors and the peak; then the activation fit."""
    report("memory", 0, 2)
    model, optimizer = runner.model, runner.optimizer
    step = tracked_step(runner)
    peak, saved, gradients = step.peak, step.saved, step.gradients
    samples_seen = runner.last_batch
    report("memory", 1, 2)
    fit = _activation_fit(runner, saved)
    report("memory", 2, 2)
    breakdown = MemoryBreakdown(
        parameters=mem.parameter_bytes(model),
        buffers=mem.buffer_bytes(model),
        gradients=gradients,
        optimizer_states=mem.optimizer_state_bytes(optimizer),
        optimizer_step=mem.optimizer_step_kind(optimizer),
        activations=saved.activations,
        autocast_weight_copies=saved.autocast_weight_copies,
        activations_by_module=[ModuleBytes(module=k, bytes=v) for k, v in saved.by_module.items()],
        activation_fit=fit,
        peak=peak.peak,
        peak_source=peak.source,  # type: ignore[arg-type]
        at_peak=peak.at_peak,
        cuda_reserved=peak.cuda_reserved,
        process_rss=mem.process_rss(),
        live_tensor_peak=peak.live_tensors,
        backward_peak=step.backward[0] if step.backward else None,
        backward_at_peak=step.backward[1] if step.backward else None,
        fits_judged_on=f"memory.peak ({_JUDGED_ON.get(peak.source, peak.source)})",
    )
    return breakdown, samples_seen


_JUDGED_ON = {
    "cuda_max_allocated": "torch.cuda.max_memory_allocated",
    "cpu_allocator": "c10's CPU allocator in a plain step: tensors and other allocations",
    "cpu_live_tensors": "live tensor bytes",
}


def _count_forward(runner: TrainRunner, batch_size: int) -> mem.SavedTensors:
    """Saved-for-backward bytes of one forward at ``batch_size`` (no backward, no step)."""
    stream = runner.model_file.batches(batch_size)
    try:
        batch = runner.model_file.move(next(stream), runner.device)
    finally:
        stream.close()  # type: ignore[attr-defined]
    with mem.count_saved_tensors(runner.model) as saved:
        loss = runner.forward(batch)
    del loss
    return saved


def _activation_fit(runner: TrainRunner, measured: mem.SavedTensors) -> ActivationFit | None:
    """Activations as fixed + per-sample parts, without checkpointing, at B and a second size."""
    b1 = runner.micro_batch
    b2 = b1 // 2 if b1 >= 2 else 2
    apply_checkpointing(runner.model, 0)
    try:
        first = measured if runner.checkpoint_blocks == 0 else _count_forward(runner, b1)
        second = _count_forward(runner, b2)
    finally:
        apply_checkpointing(runner.model, runner.checkpoint_blocks)
    low, high = sorted([(b1, first), (b2, second)], key=lambda pair: pair[0])
    span = high[0] - low[0]
    per_sample = (high[1].activations - low[1].activations) / span
    fit: dict[str, Any] = {
        "batch_sizes": (low[0], high[0]),
        "fixed": round(low[1].activations - per_sample * low[0]),
        "per_sample": per_sample,
        "precision": runner.precision,
    }
    blocks_low, blocks_high = mem.block_bytes(low[1]), mem.block_bytes(high[1])
    if blocks_low is not None and blocks_high is not None:
        block_per_sample = (blocks_high - blocks_low) / span
        fit["block_per_sample"] = block_per_sample
        fit["block_fixed"] = round(blocks_low - block_per_sample * low[0])
    if low[1].block_input is not None and high[1].block_input is not None:
        fit["block_input_per_sample"] = (high[1].block_input - low[1].block_input) / span
    return ActivationFit(**fit)


class _OpCount(TorchDispatchMode):
    """The aten operators dispatched inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _counting(counter: FlopCounterMode, ops: _OpCount) -> Iterator[None]:
    """FLOPs and operators counted together (one use)."""
    with counter, ops:
        yield


OP_LOOPS = 200
"""A tiny Linear's forward and backward timed this many times for the seconds per operator."""


def seconds_per_op(device: torch.device) -> float:
    """Seconds per aten operator where compute is next to nothing: a 4x4 Linear's forward and
    backward, :data:`OP_LOOPS` times after a warm-up, over the operators it dispatches (about
    16). What every operator of a model costs beyond its compute, give or take its module's
    Python: a milliseconds' measure."""
    layer = nn.Linear(4, 4, device=device)
    sample = torch.ones(1, 4, device=device, requires_grad=True)

    def once() -> None:
        layer(sample).sum().backward()

    for _ in range(OP_LOOPS // 10):
        once()
    counted = _OpCount()
    with counted:
        once()
    dev.synchronize(device)
    start = time.perf_counter()
    for _ in range(OP_LOOPS):
        once()
    dev.synchronize(device)
    return (time.perf_counter() - start) / OP_LOOPS / max(counted.ops, 1)


def _flop_counter() -> FlopCounterMode:
    """torch's FLOP counter with autotune's attention formulas."""
    return FlopCounterMode(display=False, custom_mapping=_FLOP_FORMULAS)


def _count_flops(runner: TrainRunner) -> float:
    """FLOPs of one forward + backward (the optimizer's are not model FLOPs)."""
    batch = runner.next_batch()
    counter = _flop_counter()
    with counter:
        loss = runner.forward(batch)
        runner.backward(loss)
    runner.optimizer.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def _measure_compute(runner: TrainRunner, checkpointing: bool, counted: float | None) -> Compute:
    """Hardware FLOPs as run (``counted`` in the warm-up where it ran, else a pass counted now);
    model FLOPs with checkpointing off (no recomputation)."""
    hardware = counted if counted is not None else _count_flops(runner)
    model_flops = hardware
    if checkpointing:
        apply_checkpointing(runner.model, 0)
        try:
            model_flops = _count_flops(runner)
        finally:
            apply_checkpointing(runner.model, runner.checkpoint_blocks)
    return Compute(flops_per_step=model_flops, hardware_flops_per_step=hardware)


def _utilisation(
    compute: Compute, step: float, device: torch.device, peak: float | None, source: str | None
) -> Compute:
    """Achieved FLOP/s, MFU (model FLOPs) and HFU (with recomputation) against ``peak``."""
    achieved = compute.flops_per_step / step if compute.flops_per_step else None
    hardware = compute.hardware_flops_per_step
    note = "on CPU the peak is a measured matmul, not a datasheet figure" if source else None
    return compute.model_copy(
        update={
            "achieved_flops_per_s": achieved,
            "peak_flops_per_s": peak,
            "peak_source": source,
            "mfu": achieved / peak if achieved and peak else None,
            "hfu": hardware / step / peak if hardware and peak else None,
            "note": note if device.type == "cpu" else None,
        }
    )


def _capabilities(device: torch.device) -> tuple[Capabilities, str | None]:
    """The device's capabilities; a bf16/fp32 matmul ratio outside its physical range is
    measured once more (a busy machine skews one run), then refused: ``None``, with the reason.
    """
    caps = dev.device_capabilities(device)
    first = caps.bf16_fp32_speed_ratio
    if bf16_ratio_problem(first, device.type) is None:
        return caps, None
    dev.forget_matmuls(device)
    caps = dev.device_capabilities(device)
    second = caps.bf16_fp32_speed_ratio
    why = bf16_ratio_problem(second, device.type)
    if why is None:
        return caps, None
    reason = f"refused after measuring twice ({first:.3g}x, {second:.3g}x): {why}"
    return caps.model_copy(update={"bf16_fp32_speed_ratio": None}), reason


def _environment(
    device: torch.device, timings: _Timings, peak_reason: str | None, workspace: int
) -> tuple[Environment, dict[str, str]]:
    """The environment (``workspace``: :func:`dev.blas_workspace`'s bytes), and the figures
    refused as impossible (dotted key -> why)."""
    versions = dev.versions()
    unavailable: dict[str, str] = {}
    capabilities, refused = _capabilities(device)
    if refused:
        unavailable["capabilities.bf16_fp32_speed_ratio"] = refused
    if timings.nvml is None:
        unavailable["nvml"] = timings.nvml_reason or "not sampled"
    if peak_reason:
        unavailable["compute.peak_flops_per_s"] = peak_reason
    if versions["cuda"] is None:
        unavailable["cuda_version"] = "torch is built without CUDA"
    if versions["deepspeed"] is None:
        unavailable["deepspeed_version"] = "deepspeed is not installed"
    links = dev.nvml_links(device)
    for field, value in (("memory_bandwidth_bytes_per_s", links.memory_bytes_per_s),
                         ("pcie_gbps", links.pcie_gbps)):  # fmt: skip
        if value is None:
            unavailable[field] = links.reason or "not read"
    if device.type != "cuda":
        unavailable["capabilities.compute_capability"] = "not a CUDA device"
        unavailable["memory.cuda_reserved"] = "not a CUDA device"
    environment = Environment(
        device_type=device.type,
        device_name=dev.device_name(device),
        device_count=dev.device_count(device),
        device_memory_bytes=dev.device_memory(device),
        torch_version=str(versions["torch"]),
        cuda_version=versions["cuda"],
        deepspeed_version=versions["deepspeed"],
        capabilities=capabilities,
        nvml=timings.nvml,
        threads=torch.get_num_threads(),
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        host_adam_per_s=host.host_adam_rate(),
        memory_bandwidth_bytes_per_s=links.memory_bytes_per_s,
        pcie_gbps=links.pcie_gbps,
        blas_workspace_bytes=workspace,
        unavailable=unavailable,
    )
    return environment, {BF16_RATIO_FIGURE: refused} if refused else {}


def _model_info(model: nn.Module, tokens: int | None) -> ModelInfo:
    found = find_block_stack(model)
    stack = None
    if found is not None:
        path, blocks = found
        stack = BlockStack(
            path=path,
            count=len(blocks),
            block_class=type(blocks[0]).__name__,
            block_parameters=unique_parameter_count(blocks[0]),
        )
    trainable = nn.ParameterList([p for p in model.parameters() if p.requires_grad])
    get_input = getattr(model, "get_input_embeddings", None)
    try:
        table = get_input() if callable(get_input) else None
    except NotImplementedError:  # transformers' multi-tower models (CLIP) have no one table
        table = None
    embeddings = (
        [table]
        if isinstance(table, nn.Embedding)
        else [m for m in model.modules() if isinstance(m, nn.Embedding)]
    )
    config = getattr(model, "config", None)
    return ModelInfo(
        class_name=type(model).__name__,
        parameters=unique_parameter_count(model),
        trainable_parameters=unique_parameter_count(trainable),
        embedding_parameters=sum(m.weight.numel() for m in embeddings),
        largest_layer_parameters=max(
            (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
            default=0,
        ),
        largest_tied_parameters=_largest_tied(model),
        parameter_sizes=[p.numel() for p in trainable],
        block_stack=stack,
        tokens_per_sample=tokens,
        hidden_size=getattr(config, "hidden_size", None),
        num_attention_heads=getattr(config, "num_attention_heads", None),
        num_layers=getattr(config, "num_hidden_layers", None),
        attention=getattr(config, "_attn_implementation", None),
    )


def _largest_tied(model: nn.Module) -> int:
    """Elements of the largest trainable parameter more than one module holds (a head tied to
    the input embedding), whose gradients autograd sums at its last use; 0 where none is."""
    holders: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            holders[id(param)] = holders.get(id(param), 0) + 1
            sizes[id(param)] = param.numel() if param.requires_grad else 0
    return max((sizes[key] for key, count in holders.items() if count > 1), default=0)


def _provenance(model_file: ModelFile, command: str | None, label: str | None) -> Provenance:
    return Provenance(
        command=redact(command or " ".join(sys.argv)),
        model_file=label or str(model_file.path),
        model_sha256=model_file.sha256,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        autotune_version=__version__,
    )


def return_freed_memory() -> None:
    """Collect garbage and hand the heap's freed pages back to the system (glibc's
    ``malloc_trim``), so what this process profiled and dropped is available to the trials
    it launches: GPT-2 small left 3.5 GB of freed heap in the process otherwise. Elsewhere
    (another C library, no ``libc.so.6``) only the collection runs."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
