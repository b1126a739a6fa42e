"""One real, uninstrumented training step of the user's model, timed by phase."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch

from autotune.records import AUTOCAST_PLAN_PRECISION, AutotuneError
from autotune.runtime._blocks import apply_checkpointing
from autotune.runtime._device import resolve_device, synchronize
from autotune.runtime.modelfile import ModelFile

if TYPE_CHECKING:
    from autotune.records import Plan

StepPrecision = Literal["fp32", "bf16", "fp16"]
AUTOCAST: dict[str, StepPrecision] = {
    plan: cast(StepPrecision, dtype) for dtype, plan in AUTOCAST_PLAN_PRECISION.items()
}
"""Plan precisions a plain torch step runs (autocast dtype); the others need DeepSpeed."""
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepTiming:
    """Seconds spent in each phase of one optimizer step (summed over micro-batches)."""

    loss: float
    dataloader: float
    forward: float
    backward: float
    optimizer: float
    total: float


class TrainRunner:
    """Builds the model, optimizer and batch stream once; runs optimizer steps.

    Args:
        model_file: the loaded model file.
        device: a ``torch.device`` or a name for :func:`resolve_device`.
        precision: ``fp32``, or the autocast dtype ``bf16``/``fp16`` (fp32 parameters).
        checkpoint_blocks: how many blocks of the stack to checkpoint.
        micro_batch: samples per forward.
        grad_accum: micro-batches per optimizer step.
        workers: DataLoader workers (``None`` keeps the file's).
        pin_memory: pin host batches (CUDA only).
        seed: seeds torch before the model is built.
    """

    def __init__(
        self,
        model_file: ModelFile,
        *,
        device: torch.device | str = "cpu",
        precision: StepPrecision = "fp32",
        checkpoint_blocks: int = 0,
        micro_batch: int,
        grad_accum: int = 1,
        workers: int | None = None,
        pin_memory: bool = False,
        seed: int = 0,
    ) -> None:
        if precision not in ("fp32", "bf16", "fp16"):
            raise AutotuneError(f"precision: {precision!r} is not fp32, bf16 or fp16")
        if micro_batch < 1 or grad_accum < 1:
            raise AutotuneError("micro_batch and grad_accum must be at least 1")
        self.model_file = model_file
        self.device = device if isinstance(device, torch.device) else resolve_device(device)
        self.precision = precision
        self.micro_batch = micro_batch
        self.grad_accum = grad_accum
        torch.manual_seed(seed)
        self.model = model_file.build_model()
        if any(p.device != self.device for p in self.model.parameters()):
            self.model = self.model.to(self.device)
        self.model.train()
        apply_checkpointing(self.model, checkpoint_blocks)
        self.checkpoint_blocks = checkpoint_blocks
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = model_file.build_optimizer(trainable)
        enabled = precision == "fp16"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=enabled)
        self._workers, self._pin_memory = workers, pin_memory
        self._batches = model_file.batches(micro_batch, workers=workers, pin_memory=pin_memory)
        self.last_batch: Any = None

    def rebatch(self, micro_batch: int) -> None:
        """Draw micro-batches of ``micro_batch`` samples from now on (a new batch stream; the
        model and optimizer stay as they are)."""
        if micro_batch < 1:
            raise AutotuneError("micro_batch must be at least 1")
        self.close()
        self.micro_batch = micro_batch
        self._batches = self.model_file.batches(
            micro_batch, workers=self._workers, pin_memory=self._pin_memory
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context of this precision (a no-op for fp32)."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=_AUTOCAST[self.precision])

    def next_batch(self) -> Any:
        """The next batch, on the device."""
        batch = next(self._batches)
        self.last_batch = batch
        return self.model_file.move(batch, self.device, non_blocking=True)

    def forward(self, batch: Any) -> torch.Tensor:
        """Forward and loss under autocast, scaled for accumulation."""
        with self.autocast():
            loss = self.model_file.loss(self.model, batch)
        return loss / self.grad_accum if self.grad_accum > 1 else loss

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the (loss-scaled, for fp16) loss."""
        self.model_file.call("backward", self.scaler.scale(loss).backward)

    def optimizer_step(self) -> None:
        """Step the optimizer and clear gradients."""
        self.model_file.call("optimizer.step()", self.scaler.step, self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def micro_batches(self) -> Iterator[int]:
        """Indices of the micro-batches of one step (for instrumented callers)."""
        return iter(range(self.grad_accum))

    def step(self, passes: contextlib.AbstractContextManager[Any] | None = None) -> StepTiming:
        """Run one optimizer step (``grad_accum`` micro-batches), timing each phase; the
        forward and backward passes inside ``passes`` where given (the optimizer step out)."""
        sync = self.device
        data = fwd = bwd = 0.0
        total_loss = 0.0
        synchronize(sync)
        start = time.perf_counter()
        with passes or contextlib.nullcontext():
            for _ in range(self.grad_accum):
                t0 = time.perf_counter()
                batch = self.next_batch()
                synchronize(sync)
                t1 = time.perf_counter()
                loss = self.forward(batch)
                total_loss += float(loss.detach())
                t2 = time.perf_counter()
                self.backward(loss)
                synchronize(sync)
                t3 = time.perf_counter()
                data, fwd, bwd = data + t1 - t0, fwd + t2 - t1, bwd + t3 - t2
        t4 = time.perf_counter()
        self.optimizer_step()
        synchronize(sync)
        end = time.perf_counter()
        return StepTiming(total_loss, data, fwd, bwd, end - t4, end - start)

    def close(self) -> None:
        """Drop the batch stream (ends DataLoader worker processes)."""
        close = getattr(self._batches, "close", None)
        if close is not None:
            close()


def runner_for_plan(
    model_file: ModelFile, plan: Plan, *, device: str, seed: int = 0
) -> TrainRunner:
    """A runner with every in-process knob of ``plan`` applied.

    Autocast precision, checkpointed blocks, micro-batch and accumulation, DataLoader
    workers (0 keeps the file's own loader), attention implementation, compile.

    Raises:
        ValueError: the plan needs DeepSpeed (16-bit weights).
        NotImplementedError: the model cannot switch to the plan's attention.
    """
    if plan.precision not in AUTOCAST:
        raise ValueError(f"precision={plan.precision} needs DeepSpeed, not a plain torch step")
    runner = TrainRunner(
        model_file,
        device=device,
        precision=AUTOCAST[plan.precision],
        checkpoint_blocks=plan.checkpoint_blocks,
        micro_batch=plan.micro_batch,
        grad_accum=plan.grad_accum,
        workers=plan.dataloader_workers or None,
        pin_memory=plan.pin_memory,
        seed=seed,
    )
    if plan.attention != "default":
        setter = getattr(runner.model, "set_attn_implementation", None)
        if setter is None:
            raise NotImplementedError(
                f"attention={plan.attention}: the model has no set_attn_implementation"
            )
        setter(plan.attention)
    if plan.compile:
        runner.model = torch.compile(runner.model)  # type: ignore[assignment]
    return runner
