"""The cost model: pure arithmetic for model-state, activation, communication and time costs.

No torch, no printing: numbers in, numbers out. The formulas are METHOD.md's
(sections 2-4); every function says which accounting it follows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Accounting = Literal["deepspeed", "fsdp2", "paper", "torch"]

WEIGHT_BYTES = {"fp32": 4, "amp_bf16": 4, "amp_fp16": 4, "bf16": 2, "fp16": 2}
"""Bytes per stored weight for each plan precision (autocast keeps fp32 parameters)."""

ADAM_STATE_BYTES = 8.0
"""Adam/AdamW moments (m, v) in fp32, per trainable parameter."""

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class ActivationFigures:
    """Bytes saved for backward as ``fixed + per_sample * b``, for the whole model and one block.

    ``fixed``/``per_sample`` cover the whole forward without checkpointing;
    ``block_*`` one block of the L-block stack; ``block_input_per_sample`` is
    what a checkpointed block keeps (its input).
    """

    fixed: float
    per_sample: float
    blocks: int = 0
    block_fixed: float = 0.0
    block_per_sample: float = 0.0
    block_input_fixed: float = 0.0
    block_input_per_sample: float = 0.0

    def block(self, micro_batch: int) -> float:
        """One block's saved bytes at this micro-batch."""
        return self.block_fixed + self.block_per_sample * micro_batch

    def block_input(self, micro_batch: int) -> float:
        """What one checkpointed block keeps (its inputs) at this micro-batch."""
        return self.block_input_fixed + self.block_input_per_sample * micro_batch

    def total(self, micro_batch: int) -> float:
        """The whole forward's saved bytes without checkpointing."""
        return self.fixed + self.per_sample * micro_batch


def saved_activations(fig: ActivationFigures, micro_batch: int, checkpoint_blocks: int) -> float:
    """Bytes saved for backward at the end of the forward with k of L blocks checkpointed.

    A checkpointed block keeps only its input; the others keep everything.
    """
    k = min(max(checkpoint_blocks, 0), fig.blocks)
    dropped = k * (fig.block(micro_batch) - fig.block_input(micro_batch))
    return max(fig.total(micro_batch) - dropped, 0.0)


def activation_peak(fig: ActivationFigures, micro_batch: int, checkpoint_blocks: int) -> float:
    """Activation bytes at their highest: the saved set plus, when any block is checkpointed,
    one block's full activations recomputed during its backward.
    """
    saved = saved_activations(fig, micro_batch, checkpoint_blocks)
    recompute = fig.block(micro_batch) if checkpoint_blocks > 0 and fig.blocks > 0 else 0.0
    return saved + recompute


def communicated_bytes_per_element(precision: str) -> int:
    """Gradients travel in the weights' dtype: fp32 under torch/autocast, 16-bit under DeepSpeed bf16/fp16."""
    return WEIGHT_BYTES[precision]


def transfer_seconds(nbytes: float, gbps: float | None) -> float | None:
    """Seconds to move ``nbytes`` at ``gbps`` gigabits per second; None when the bandwidth is unknown."""
    if nbytes <= 0:
        return 0.0
    if gbps is None or gbps <= 0:
        return None
    return nbytes / (gbps * 1e9 / 8.0)


def flops_per_token(
    psi_non_embedding: float, layers: int = 0, hidden: int = 0, seq_len: int = 0
) -> float:
    """Model training FLOPs per token: 6 psi (no embedding lookup) plus attention 12 L h s."""
    return 6.0 * psi_non_embedding + 12.0 * layers * hidden * seq_len


def recompute_flops_per_token(
    block_parameters: float, hidden: int, seq_len: int, checkpoint_blocks: int
) -> float:
    """Hardware FLOPs per token that recomputing ``checkpoint_blocks`` blocks adds beyond the model's.

    Each recomputed block runs its forward once more: 2 FLOPs per block parameter
    plus attention's forward 4 h s (a third of the 12 h s per layer in
    :func:`flops_per_token`). Every block recomputed adds close to 8 psi: about 4/3
    of the model FLOPs, less the output head, which is not recomputed.
    """
    return checkpoint_blocks * (2.0 * block_parameters + 4.0 * hidden * seq_len)


def train_days(tokens: float, tokens_per_second: float) -> float:
    """Wall-clock days to process ``tokens`` at ``tokens_per_second`` (all devices together)."""
    if tokens_per_second <= 0:
        raise ValueError("tokens_per_second must be positive")
    return tokens / tokens_per_second / SECONDS_PER_DAY


def tokens_per_second_at_mfu(
    mfu: float, peak_flops: float, devices: int, flops_token: float
) -> float:
    """Throughput of ``devices`` devices running at ``mfu`` of ``peak_flops`` each."""
    return mfu * peak_flops * devices / flops_token


@dataclass(frozen=True)
class BaselineTime:
    """Measured seconds of one optimizer step of a baseline plan, by phase.

    ``block_share`` is the share of the forward's compute spent in the L-block
    stack; recomputing one checkpointed block costs ``block_share / L`` of a forward
    plus ``recompute_fixed`` seconds (checkpointing's own per-call overhead).
    ``*_fixed`` are the seconds of a phase per micro-batch that do not grow with
    the micro-batch (per-call overheads), fitted from profiles at two batch sizes;
    0 means the phase is taken as proportional to the micro-batch.
    """

    dataloader: float
    forward: float
    backward: float
    optimizer: float
    micro_batch: int
    grad_accum: int = 1
    checkpoint_blocks: int = 0
    blocks: int = 0
    block_share: float = 0.0
    recompute_fixed: float = 0.0
    dataloader_fixed: float = 0.0
    forward_fixed: float = 0.0
    backward_fixed: float = 0.0

    def scaled(self, micro_batch: int) -> tuple[float, float, float]:
        """Data, forward and backward seconds of one micro-batch of another size."""
        scale = micro_batch / self.micro_batch
        return (
            self.dataloader_fixed + (self.dataloader - self.dataloader_fixed) * scale,
            self.forward_fixed + (self.forward - self.forward_fixed) * scale,
            self.backward_fixed + (self.backward - self.backward_fixed) * scale,
        )

    def compute_scaled(self, factor: float) -> BaselineTime:
        """Forward, backward and recompute ``factor`` times longer, the optimizer step and data
        loading unchanged: the same step with its matmuls in another dtype (the optimizer steps
        fp32 master weights either way)."""
        if factor == 1.0:
            return self
        return replace(
            self,
            forward=self.forward * factor,
            backward=self.backward * factor,
            recompute_fixed=self.recompute_fixed * factor,
            forward_fixed=self.forward_fixed * factor,
            backward_fixed=self.backward_fixed * factor,
        )

    def precision_scaled(self, factor: float) -> tuple[BaselineTime, float | None]:
        """The same step with its matmuls in another dtype, ``factor`` the ratio of the two
        precisions' forward and backward measured at the baseline's micro-batch: the parts per
        micro-batch (operators' dispatch, which a dtype does not change) as they are, the parts
        per sample scaled so that forward and backward at the baseline's micro-batch come
        ``factor`` times the baseline's; all of it scaled alike (:meth:`compute_scaled`) where
        there is no part per micro-batch, or where the measured ratio asks for less than it.
        With the scale of the parts per sample, ``None`` where all of it was scaled alike."""
        fixed = self.forward_fixed + self.backward_fixed
        per_sample = self.forward + self.backward - fixed
        if factor == 1.0 or fixed <= 0.0 or per_sample <= 0.0:
            return self.compute_scaled(factor), None
        scale = (factor * (fixed + per_sample) - fixed) / per_sample
        if scale <= 0.0:
            return self.compute_scaled(factor), None
        scaled = replace(
            self,
            forward=self.forward_fixed + (self.forward - self.forward_fixed) * scale,
            backward=self.backward_fixed + (self.backward - self.backward_fixed) * scale,
        )
        return scaled, scale

    def on_cores(self, factor: float) -> BaselineTime:
        """The compute phases (forward, backward, optimizer, recompute) ``factor`` times longer:
        a rank given ``1 / factor`` of the cores the baseline ran on; data loading unchanged."""
        scaled = self.compute_scaled(factor)
        return scaled if factor == 1.0 else replace(scaled, optimizer=self.optimizer * factor)

    @property
    def step(self) -> float:
        """The baseline's own step time, rebuilt from its phases."""
        return self.grad_accum * (self.dataloader + self.forward + self.backward) + self.optimizer


def step_seconds(
    base: BaselineTime,
    *,
    micro_batch: int,
    grad_accum: int = 1,
    checkpoint_blocks: int = 0,
    optimizer_scale: float = 1.0,
    optimizer_seconds: float | None = None,
    extra_seconds: float = 0.0,
) -> float:
    """Predicted seconds per optimizer step of a plan, scaled from a measured baseline.

    Data loading, forward and backward scale linearly with the micro-batch
    (a fixed part plus a proportional part); the backward of a checkpointed
    block carries one more forward of that block (recomputation), so the
    baseline's own recompute is taken out first. The
    optimizer step scales with the trainable parameters it updates on this
    device (``optimizer_scale``), unless ``optimizer_seconds`` gives the step's own figure
    (an optimizer offloaded to the host's CPU); communication and offload time that is not
    overlapped is ``extra_seconds``.
    """
    data, forward, backward = base.scaled(micro_batch)
    share = base.block_share / base.blocks if base.blocks else 0.0
    k0 = min(base.checkpoint_blocks, base.blocks)
    k = min(checkpoint_blocks, base.blocks)
    recompute = share * forward + base.recompute_fixed  # seconds per checkpointed block
    pure_backward = max(backward - k0 * recompute, 0.0)
    micro = data + forward + pure_backward + k * recompute
    step = base.optimizer * optimizer_scale if optimizer_seconds is None else optimizer_seconds
    return grad_accum * micro + step + extra_seconds


def host_adam_seconds(partition: float, ranks_per_node: int, elements_per_s: float) -> float:
    """Seconds an offloaded Adam step takes: each of a node's ranks steps its ``partition`` of
    fp32 elements on the host's CPU at once, so the node's cores step them all at the host's
    measured rate."""
    return partition * ranks_per_node / elements_per_s
