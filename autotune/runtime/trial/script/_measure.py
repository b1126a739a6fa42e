"""The measurement inside a script trial: step boundaries, the step split, the live-tensor peak of
one tracked step, and the result file, the same :class:`TrialResult` a model-file trial writes.

The script drives the loop; this module only sees its events: the model's forward (module hooks),
every ``torch.autograd.backward`` (the loss), and the end of each optimizer step (the DeepSpeed
engine's ``step`` at an accumulation boundary, else any torch optimizer's ``step``). After the
warm-up and measured steps it tracks one more step's live tensors, writes the result, leaves the
process group with the other ranks and exits: the run stops after the trial's steps.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.records import StepSplit, TrialResult, WorkerSpec, read_record, write_record

_TRIAL: ScriptTrial | None = None
_CRASHED = False


class _Phases:
    """Seconds of one optimizer step by phase; the data wait is the time between phases."""

    def __init__(self, start: float) -> None:
        self.start = self.mark = start
        self.dataloader = self.forward = self.backward = 0.0
        self.losses: list[float] = []

    def split(self, end: float) -> tuple[float, StepSplit]:
        total = end - self.start
        rest = total - self.dataloader - self.forward - self.backward
        return total, StepSplit(dataloader=self.dataloader, forward=self.forward,
                                backward=self.backward, optimizer=max(rest, 0.0))  # fmt: skip


class ScriptTrial:
    """One trial inside the user's process: reads the spec, measures, writes the result."""

    def __init__(self, spec_path: str) -> None:
        from autotune.runtime.trial.steps import MemoryWatch, Steps

        self.spec = read_record(spec_path, WorkerSpec, "trial spec")
        self.plan, self.settings = self.spec.plan, self.spec.settings
        self.result_path = Path(self.spec.result_path)
        self.writer = int(os.environ.get("LOCAL_RANK", "0")) == 0
        self.watch = MemoryWatch(self.settings.memory_guard)
        self.steps = Steps(self.spec, self._write, self.watch)
        self.owner: str | None = None
        self.model: Any = None
        self.engine = "torch"
        self.deepspeed = False
        self.tokens: int | None = None
        self.splits: list[StepSplit] = []
        self._phase: _Phases | None = None
        self._forward_at: float | None = None
        self._backward_depth = 0
        self._measure_start = 0.0
        self._tracking: contextlib.ExitStack | None = None
        self._tracker: Any = None
        self._track_next = False
        self._cuda: int | None = None
        self._checked = False
        self._last_end: float | None = None
        self._profiling = False
        self.profile_error: str | None = None

    # -- entry points ---------------------------------------------------------------------

    def claim(self, owner: str) -> bool:
        """Whether ``owner`` injects the plan: the first entry point the script calls does;
        those it calls in turn (the Trainer's Accelerator, its ``deepspeed.initialize``) pass."""
        if self.owner is None:
            self.owner = owner
        return self.owner == owner

    def attach(self, model: Any) -> None:
        """Time ``model``'s forward and every backward; the model's first one only."""
        if self.model is not None:
            return
        import torch

        self.model = model
        self.watch.rebase()
        self.probe = probe_info(model)
        model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        model.register_forward_hook(self._after_forward)
        original = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            self._backward_depth += 1
            start = time.perf_counter()
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._backward_depth -= 1
                if self._backward_depth == 0:
                    self._after_backward(tensors, start)

        torch.autograd.backward = backward

    # -- events ---------------------------------------------------------------------------

    def _before_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._profiling:
            return
        now = time.perf_counter()
        if not self._checked:
            self._checked = True
            self._check_batch(args, kwargs)
            if self.spec.warmup_only:
                self._finish_probe(kwargs)
            self.steps.first_step_at = time.time()
            self._start = now
        if self._phase is None:  # the step began where the last one ended (its data wait too)
            self._phase = _Phases(self._last_end if self._last_end is not None else now)
        if self._track_next and self._tracking is None:
            self._start_tracking()
        self._phase.dataloader += now - self._phase.mark
        self._forward_at = now

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if self._profiling:
            return
        if self._phase is not None and self._forward_at is not None:
            now = time.perf_counter()
            self._phase.forward += now - self._forward_at
            self._phase.mark = now
            self._forward_at = None

    def _after_backward(self, tensors: Any, start: float) -> None:
        phase = self._phase
        if phase is None or self._profiling:
            return
        now = time.perf_counter()
        phase.backward += now - start
        phase.mark = now
        loss = tensors if not isinstance(tensors, list | tuple) else tensors[0]
        with contextlib.suppress(Exception):
            if loss.numel() == 1:
                phase.losses.append(float(loss.detach().float()))

    def step_end(self) -> None:
        """One optimizer step is over (every rank reaches it together)."""
        if self._profiling:
            return
        phase, self._phase = self._phase, None
        if phase is None:
            return
        now = self._last_end = time.perf_counter()
        seconds, split = phase.split(now)
        # Each framework scales a micro-batch's loss by 1/accumulation before backward.
        loss = math.fsum(phase.losses) if phase.losses else float("nan")
        if self._tracking is not None:
            self._stop_tracking()
            self._finish()
        steps, index = self.steps, len(self.steps.losses)
        steps.losses.append(loss)
        if index == 0:
            self._write(TrialResult(completed_steps=1, loss_first=loss))
        if index < self.settings.warmup:
            self._measure_start = now
            return
        steps.times.append(seconds)
        self.splits.append(split)
        from autotune.runtime.trial.steps import agree

        if agree(steps.done(now - (self._measure_start or self._start))):
            steps.steps_s = now - self._start
            self._track_next = True

    # -- the tracked step, the result -----------------------------------------------------

    def _device(self) -> Any:
        import torch

        for parameter in self.model.parameters():
            return parameter.device
        return torch.device("cpu")

    def _start_tracking(self) -> None:
        from autotune.runtime._memory import LiveTensorTracker, count_rng_states
        from autotune.runtime.trial.steps import cuda_peak, tensors_on

        device = self._device()
        self._cuda = cuda_peak(device)  # the timed steps' figure, read before tracking
        tracker = LiveTensorTracker(device)
        stack = contextlib.ExitStack()
        stack.enter_context(tracker)
        stack.enter_context(count_rng_states(tracker))
        # As the model-file trial: everything alive on the device counts as present.
        tracker.mark(tensors_on(device), "existing")
        self._tracking, self._tracker = stack, tracker

    def _stop_tracking(self) -> None:
        assert self._tracking is not None
        self._tracking.close()

    def _finish(self) -> None:
        from autotune.runtime.trial.steps import shut_down
        from autotune.runtime.trial.worker import _peaks

        steps = self.steps
        peaks = _peaks({"cuda": self._cuda, "live": self._tracker.peak}, self.watch)
        step_time = statistics.median(steps.times)
        samples = self.plan.global_batch / step_time
        split = StepSplit(**{
            field: statistics.median(getattr(s, field) for s in self.splits)
            for field in ("dataloader", "forward", "backward", "optimizer")
        })  # fmt: skip
        result = TrialResult(
            completed_steps=len(steps.losses), samples_per_s=samples,
            tokens_per_s=samples * self.tokens if self.tokens else None,
            step_time=step_time, step_times=steps.times, step_interval=steps.interval,
            split=split, **peaks, device_memory=self.settings.device_memory,
            loss_first=steps.losses[0], loss_last=steps.losses[-1],
            engine="deepspeed" if self.deepspeed else "torch",
            first_step_at=steps.first_step_at, steps_s=steps.steps_s,
        )  # fmt: skip
        self._write(result)
        self._exit(shut_down)

    def _finish_probe(self, batch: dict[str, Any]) -> None:
        from autotune.records import PROBE_ENV, PROFILE_ENV
        from autotune.runtime.trial.steps import ranks, shut_down

        if os.environ.get(PROFILE_ENV) and ranks()[0] == 0:
            self._profile(batch, Path(os.environ[PROFILE_ENV]))
        if self.writer and os.environ.get(PROBE_ENV):
            probe = self.probe.model_copy(
                update={"entry": self.owner, "profile_error": self.profile_error}
            )
            Path(os.environ[PROBE_ENV]).write_text(probe.model_dump_json(), encoding="utf-8")
        self._write(TrialResult(engine="deepspeed" if self.deepspeed else "torch"))
        self._exit(shut_down)

    def _profile(self, batch: dict[str, Any], out: Path) -> None:
        """The model-file profiler on the script's model and first batch (rank 0 only); a
        script whose model takes no keyword batch gets none, and says why."""
        from autotune.runtime.trial.script._profile import profile_script

        if not batch:
            self.profile_error = "its model's forward takes no keyword batch (model(**batch))"
            return
        self._profiling = True
        try:
            record = profile_script(self.model, dict(batch), batch_size=self.plan.micro_batch,
                                    device=self.settings.device, label=self.settings.model_file)  # fmt: skip
            write_record(out, record)
        except Exception as exc:  # the probe still stands; the composer runs without a profile
            self.profile_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        finally:
            self._profiling = False

    def _exit(self, shut_down: Any) -> None:
        global _TRIAL
        self.watch.stop()
        _TRIAL = None  # the exit below is the trial's: nothing more to record
        with contextlib.suppress(Exception):
            shut_down()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def _check_batch(self, args: Any, kwargs: Any) -> None:
        """The micro-batch must reach the script's loader: its first batch says if it did."""
        first = next((v for v in (*args, *kwargs.values()) if hasattr(v, "shape")), None)
        if first is None or not first.shape:
            return
        if first.dim() >= 2 and not first.is_floating_point():
            self.tokens = int(first.shape[1])
        if first.shape[0] != self.plan.micro_batch:
            fail(
                f"the script's batches hold {first.shape[0]} samples, the trial's micro-batch "
                f"is {self.plan.micro_batch}: pass the script's batch-size flag with "
                "--arg-map train_micro_batch_size_per_gpu=--FLAG, or build the loader from "
                "engine.train_micro_batch_size_per_gpu()"
            )

    def _write(self, result: TrialResult) -> None:
        if self.writer:
            write_record(self.result_path, result)


def probe_info(model: Any) -> Any:
    """What the composer learns from the probe launch: the block stack and the parameters."""
    from autotune.records import ScriptProbe
    from autotune.runtime._blocks import find_block_stack

    found = find_block_stack(model)
    return ScriptProbe(
        blocks=len(found[1]) if found else 0,
        block_stack=found[0] if found else None,
        parameters=sum(p.numel() for p in model.parameters()),
    )


def trial() -> ScriptTrial:
    """This process's trial, made at the first entry point the script calls."""
    global _TRIAL
    if _TRIAL is None:
        from autotune.runtime.trial.script import SPEC_ENV

        _TRIAL = ScriptTrial(os.environ[SPEC_ENV])
    return _TRIAL


def fail(message: str) -> None:
    """End the trial now with one line (``autotune: ...``) as its error."""
    line = f"autotune: {message}"
    _record_error(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(1)


def _result_path() -> Path | None:
    from autotune.runtime.trial.script import SPEC_ENV

    if _TRIAL is not None:
        return _TRIAL.result_path
    try:
        return Path(read_record(os.environ[SPEC_ENV], WorkerSpec, "trial spec").result_path)
    except Exception:
        return None


def _record_error(error: str) -> None:
    """Write ``error`` as the trial's result unless an earlier one was recorded (first wins)."""
    global _CRASHED
    _CRASHED = True
    path = _result_path()
    if path is None:
        return
    with contextlib.suppress(Exception):
        if read_record(path, TrialResult, "trial result").error:
            return
    with contextlib.suppress(Exception):
        write_record(path, TrialResult(error=error))


def script_line(exc: BaseException) -> str:
    """``ExcType: message (file:line)``, the line the script's own code raised at: the deepest
    frame outside site-packages, the standard library and autotune."""
    frames = traceback.extract_tb(exc.__traceback__)
    skip = ("site-packages", "dist-packages", os.path.dirname(os.__file__),
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))  # fmt: skip
    own = [f for f in frames if not any(f.filename.startswith(s) or s in f.filename for s in skip)]
    where = own[-1] if own else (frames[-1] if frames else None)
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0] if message else ''}".rstrip(": ")
    return f"{text} ({where.filename}:{where.lineno})" if where else text


def record_crash(exc: BaseException) -> None:
    """The script raised out of its main: its own line is the trial's error."""
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        return
    _record_error(script_line(exc))


def record_exit() -> None:
    """The script ended by itself: say what the trial missed, in one line."""
    if _CRASHED:
        return
    current = _TRIAL
    if current is None:
        if _result_path() is not None and not _has_result():
            _record_error(
                "autotune: the script called none of transformers.Trainer, deepspeed.initialize, "
                "accelerate.Accelerator, so no plan could be injected: build the training through "
                "one of them, or tune a model file (autotune tune MODEL.py)"
            )
        return
    done, needed = len(current.steps.losses), current.settings.warmup + current.settings.steps + 1
    _record_error(
        f"autotune: the script ended after {done} optimizer steps; a trial needs at least "
        f"{needed} (warm-up, measured, tracked): let it run more steps"
    )


def _has_result() -> bool:
    path = _result_path()
    return path is not None and path.exists()
