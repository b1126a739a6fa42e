"""The cost model: pure arithmetic for model-state, activation, communication and time costs.

No torch, no printing: numbers in, numbers out. The formulas are METHOD.md's
(sections 2-4); every function says which accounting it follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Accounting = Literal["deepspeed", "paper", "torch"]

WEIGHT_BYTES = {"fp32": 4, "amp_bf16": 4, "amp_fp16": 4, "bf16": 2, "fp16": 2}
"""Bytes per stored weight for each plan precision (autocast keeps fp32 parameters)."""

ADAM_STATE_BYTES = 8.0
"""Adam/AdamW moments (m, v) in fp32, per trainable parameter."""

PAPER_K = 12
"""The ZeRO paper's optimizer multiplier for mixed precision: fp32 master + m + v."""

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class StateBytes:
    """Model-state bytes held on one device, by category."""

    parameters: float
    gradients: float
    optimizer_states: float
    accounting: Accounting
    step_gradients: float = 0.0
    """Of ``gradients``, the bytes that exist only during the optimizer step."""

    @property
    def total(self) -> float:
        """Parameters + gradients + optimizer states."""
        return self.parameters + self.gradients + self.optimizer_states


def is_deepspeed(precision: str, zero_stage: int, offload_optimizer: bool = False) -> bool:
    """Whether a plan runs under a DeepSpeed engine (16-bit weights, ZeRO or offload)."""
    return zero_stage > 0 or WEIGHT_BYTES[precision] == 2 or offload_optimizer


def paper_floor(psi: float, zero_stage: int, world_size: int, k: int = PAPER_K) -> StateBytes:
    """The ZeRO paper's mixed-precision model states per device: (2 + 2 + K) psi, sharded.

    Args:
        psi: parameter count.
        zero_stage: 0-3; stage 1 shards the optimizer, 2 also gradients, 3 also parameters.
        world_size: data-parallel devices N.
        k: optimizer bytes per parameter (12 for Adam with an fp32 master copy).

    Returns:
        The floor in bytes; no implementation holds less than this for Adam.
    """
    n = max(world_size, 1)
    return StateBytes(
        parameters=2 * psi / (n if zero_stage >= 3 else 1),
        gradients=2 * psi / (n if zero_stage >= 2 else 1),
        optimizer_states=k * psi / (n if zero_stage >= 1 else 1),
        accounting="paper",
    )


def model_state_bytes(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    zero_stage: int = 0,
    world_size: int = 1,
    largest_layer: float = 0.0,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> StateBytes:
    """Model-state bytes per device as the implementation that runs the plan allocates them.

    Plain torch (fp32 or autocast, no ZeRO): 4 bytes per weight, 4 per gradient,
    ``optimizer_bytes_per_param`` per trainable parameter. Under DeepSpeed
    (METHOD.md section 2): weights and gradients in the plan's dtype, an fp32
    master copy plus the optimizer moments sharded from stage 1, an fp32 gradient
    partition at the optimizer step; stage 3 also gathers the largest layer's
    16-bit parameters and gradients (2 + 2 bytes each) and keeps no separate
    16-bit gradient partition. For 16-bit weights this gives stage 1
    (2 + 2 + 16/N), stage 2 (2 + 18/N), stage 3 18/N + 4 x largest.

    Args:
        parameters: all parameters (frozen ones are held too).
        trainable: parameters with gradients; gradients and optimizer states follow them.
        precision: a plan precision (fp32, amp_bf16, amp_fp16, bf16, fp16).
        zero_stage: DeepSpeed ZeRO stage 0-3.
        world_size: data-parallel devices N.
        largest_layer: parameter count of the largest single module (stage 3 gathers it).
        optimizer_bytes_per_param: the optimizer's own state per trainable parameter
            (8 for Adam; measured when a profile read it from the optimizer).
        offload_optimizer: optimizer states and fp32 gradient partition live on the CPU.
        offload_param: parameter partitions live on the CPU (stage 3).
    """
    w = WEIGHT_BYTES[precision]
    if not is_deepspeed(precision, zero_stage, offload_optimizer):
        return StateBytes(
            parameters=w * parameters,
            gradients=4.0 * trainable,
            optimizer_states=optimizer_bytes_per_param * trainable,
            accounting="torch",
        )
    n = max(world_size, 1)
    shard_opt = n if zero_stage >= 1 else 1
    params = 0.0 if offload_param else w * parameters / (n if zero_stage >= 3 else 1)
    # With the optimizer offloaded, gradients stream to the host during backward
    # (only a bucket stays): DeepSpeed's offload estimators count none on the device.
    grads = 0.0 if offload_optimizer else w * trainable / (n if zero_stage >= 2 else 1)
    fp32_grad_partition = 0.0 if offload_optimizer else 4.0 * trainable / shard_opt
    optimizer = (
        0.0 if offload_optimizer else (optimizer_bytes_per_param + 4.0) * trainable / shard_opt
    )
    if zero_stage >= 3:
        # DeepSpeed's stage-3 estimator: 18/N (no separate 16-bit gradient partition;
        # gradients are reduced into the fp32 partition) + the gathered largest layer.
        params += w * largest_layer
        grads = w * largest_layer
    return StateBytes(
        parameters=params,
        gradients=grads + fp32_grad_partition,
        optimizer_states=optimizer,
        accounting="deepspeed",
        # Stages 1-2 build the fp32 partition in step() and free it after (deepspeed 0.19
        # stage_1_and_2.py step); stage 3 holds it from the start.
        step_gradients=fp32_grad_partition if zero_stage < 3 else 0.0,
    )


def zero_bucket_bytes(
    *, zero_stage: int, bucket_elements: float, precision: str, overlap_comm: bool = True
) -> float:
    """Device bytes of DeepSpeed ZeRO's gradient buckets, each ``bucket_elements`` long.

    Stages 1 and 2 (deepspeed 0.19 ``stage_1_and_2.py`` ``setup_buckets``) allocate
    one bucket per communication dtype at the first gradient of every backward, two
    with ``overlap_comm``, in the weights' dtype (fp32 under autocast), and free them
    when the backward ends. Stage 3 (``stage3.py`` ``__init__``) holds one per
    communication dtype, in that dtype, for the whole run. Under autocast DeepSpeed
    communicates ``nn.Linear`` weights in the autocast dtype and the rest in fp32:
    two buckets, counted whether or not the model has both kinds.
    """
    if zero_stage <= 0:
        return 0.0
    w = WEIGHT_BYTES[precision]
    amp = precision.startswith("amp")
    if zero_stage >= 3:
        return bucket_elements * (4 + 2 if amp else w)
    return bucket_elements * w * (2 if amp else 1) * (2 if overlap_comm else 1)


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


def communication_elements(
    psi: float, zero_stage: int, world_size: int, grad_accum: int = 1
) -> float:
    """Elements each device sends per optimizer step (ZeRO paper volumes).

    Stages 0 and 1 all-reduce the gradients once per step (2 psi). Stage 2
    reduce-scatters gradients every micro-batch (psi each) and all-gathers the
    updated parameters once (psi): 2 psi without accumulation. Stage 3 also
    all-gathers the parameters in forward and backward of every micro-batch:
    3 psi per micro-batch.
    """
    if world_size <= 1:
        return 0.0
    if zero_stage <= 1:
        return 2.0 * psi
    if zero_stage == 2:
        return psi * grad_accum + psi
    return 3.0 * psi * grad_accum


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


def offload_bytes_per_step(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    world_size: int,
    grad_accum: int,
    offload_optimizer: bool,
    offload_param: bool,
) -> float:
    """PCIe bytes per optimizer step for offload: gradients down and updated weights up
    (optimizer offload), parameter partitions fetched for forward and backward of every
    micro-batch (parameter offload).
    """
    n = max(world_size, 1)
    w = WEIGHT_BYTES[precision]
    total = 0.0
    if offload_optimizer:
        total += (w * grad_accum + w) * trainable / n
    if offload_param:
        total += 2.0 * w * parameters / n * grad_accum
    return total


def flops_per_token(
    psi_non_embedding: float, layers: int = 0, hidden: int = 0, seq_len: int = 0
) -> float:
    """Model training FLOPs per token: 6 psi (no embedding lookup) plus attention 12 L h s."""
    return 6.0 * psi_non_embedding + 12.0 * layers * hidden * seq_len


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
    extra_seconds: float = 0.0,
) -> float:
    """Predicted seconds per optimizer step of a plan, scaled from a measured baseline.

    Data loading, forward and backward scale linearly with the micro-batch
    (a fixed part plus a proportional part); the backward of a checkpointed
    block carries one more forward of that block (recomputation), so the
    baseline's own recompute is taken out first. The
    optimizer step scales with the trainable parameters it updates on this
    device (``optimizer_scale``); communication and offload time that is not
    overlapped is ``extra_seconds``.
    """
    data, forward, backward = base.scaled(micro_batch)
    share = base.block_share / base.blocks if base.blocks else 0.0
    k0 = min(base.checkpoint_blocks, base.blocks)
    k = min(checkpoint_blocks, base.blocks)
    recompute = share * forward + base.recompute_fixed  # seconds per checkpointed block
    pure_backward = max(backward - k0 * recompute, 0.0)
    micro = data + forward + pure_backward + k * recompute
    return grad_accum * micro + base.optimizer * optimizer_scale + extra_seconds
