"""FSDP2 memory accounting (``torch.distributed.fsdp.fully_shard``): model states and gathered blocks.

The one home of the FSDP2 formulas; pure arithmetic, no torch. Read from torch 2.13's
``torch/distributed/fsdp/_fully_shard/`` (``_fully_shard.py`` docstring, ``_fsdp_param.py``,
``_fsdp_param_group.py``, ``_fsdp_state.py``, ``_fsdp_collectives.py``) for the layout the
emitter writes: ``fully_shard`` on every block of the repeated stack, then on the root.

- Every parameter is a dim-0 shard (``Shard(0)``) in its original dtype (fp32): 4 psi / N per
  rank; a ``MixedPrecisionPolicy`` casts only the all-gathered copy to ``param_dtype``.
- Gradients are reduce-scattered in ``reduce_dtype`` (fp32) into sharded ``.grad`` DTensors:
  4 psi / N; the optimizer's states live on the shards: (8 for Adam) psi / N.
- Before a group's forward its parameters are all-gathered (``param_dtype`` bytes each).
  ``reshard_after_forward=True`` frees them after the forward and gathers them again in
  backward; ``False`` keeps every group gathered from forward to its backward. The root's
  group is never resharded after forward (``_fsdp_state.py`` ``_lazy_init``: "for the root,
  do not reshard after forward"). When backward starts (every activation saved) the last
  block is gathered again; the next block's prefetch (``_fsdp_param_group.py``
  ``_backward_prefetch``) comes once the first activations are freed. Measured on CPU by
  ``bench/zero_peaks.py``: root + one block at that moment.
- After a group's backward its unsharded gradients are copied into a flat reduce-scatter
  input in ``reduce_dtype`` and freed; the output (one shard) is added into ``.grad``.
- ``CPUOffloadPolicy`` keeps shards, gradients and optimizer states on the host.
"""

from __future__ import annotations

from autotune.estimator._costmodel import ADAM_STATE_BYTES, WEIGHT_BYTES
from autotune.estimator._modelfacts import ModelFacts
from autotune.estimator._zero import StateBytes, ZeroMoments, states_for
from autotune.records import Plan

SHARD_BYTES = 4.0
"""Sharded parameters and gradients stay fp32 under every precision FSDP2 plans take."""


def gathered_dtype_bytes(precision: str) -> float:
    """Bytes of an all-gathered parameter: ``param_dtype`` (bf16 under ``precision=bf16``)."""
    return float(WEIGHT_BYTES[precision])


def fsdp2_state_bytes(
    *,
    parameters: float,
    trainable: float,
    world_size: int,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    offload: bool = False,
) -> StateBytes:
    """Sharded model states per rank: (4 + 4 + 8) psi / N for fp32 shards and Adam.

    Args:
        parameters: all parameters (frozen ones are sharded too).
        trainable: parameters with gradients and optimizer states.
        world_size: ranks N in the shard mesh.
        optimizer_bytes_per_param: the optimizer's state per trainable parameter.
        offload: ``CPUOffloadPolicy``: all three live on the host, none on the device.
    """
    n = max(world_size, 1)
    if offload:
        return StateBytes(0.0, 0.0, 0.0, accounting="fsdp2")
    return StateBytes(
        parameters=SHARD_BYTES * parameters / n,
        gradients=SHARD_BYTES * trainable / n,
        optimizer_states=optimizer_bytes_per_param * trainable / n,
        accounting="fsdp2",
    )


def fsdp2_engine_bytes(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    world_size: int,
    reshard_after_forward: bool,
    block_parameters: float,
    num_layers: int,
    grad_accum: int = 1,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    offload: bool = False,
    checkpoint_blocks: int = 0,
    tied_parameters: float = 0.0,
    largest_parameter: float = 0.0,
    gloo: bool = False,
) -> ZeroMoments:
    """What FSDP2 holds per rank at each moment the step can peak (see the module docstring).

    ``backward``: the start of backward, every activation saved; gathered are the root's
    group and, with ``reshard_after_forward``, the last block (without it, every group).
    ``recompute`` (with ``checkpoint_blocks``): a checkpointed block recomputed in backward.
    Its pre-backward hook gathers it and prefetches the block before it
    (``_fsdp_param_group.py:576-585``); the recompute's forward hooks neither gather nor
    reshard (``_fsdp_state.py:290-303, 323-327``): with ``reshard_after_forward`` two blocks
    are gathered beside the root. The later blocks' gradients are reduce-scattered into
    sharded ``.grad`` by then (counted as all blocks but one), and the root group's unsharded
    gradients (``param_dtype``) wait for its post-backward at the very end
    (``_fsdp_state.py:395``). Measured per rank on tiny Llama (``bench/zero_peaks.py``, an
    event replay of the peak): fp32 stage 3, all 4 blocks checkpointed, 14.21 MiB, of which
    two gathered blocks, the root's gathered parameters and 0.99 MiB of its gradients.
    ``reduce``: the end of backward, the root group's unsharded gradients and their
    reduce-scatter input beside the sharded ``.grad``; or, a moment before, a parameter several
    modules share (``tied_parameters``: a head tied to the input embedding) at its last use, its
    gradient as the sum of the head's and the embedding's (three of its size, before the root's
    reduce-scatter, while the first block's reduce-scatter buffers are still held: a 6-block
    GPT-2 with a 50k vocabulary, -8.6 % without them).
    ``block_reduce`` (two blocks or more): the last block's backward is over, its activations
    freed (the estimate takes them off), its gradients reduce-scattered: the reduce-scatter's
    input and output in ``reduce_dtype`` (fp32) stay held until the next reduce, with gloo's
    clone of the input (``gloo``: a CPU device; NCCL makes none), beside the head's unsharded
    gradient. The last block is resharded; with ``reshard_after_forward`` the next block is
    gathered, its all-gather buffer still held while it is copied out (two of its size).
    Named in a replay of GPT-2 small's peak on 4 ranks (fp32 stage 3, micro-batch 1): -4.8 %
    without it.
    ``optimizer``: the sharded states alone.
    """
    states = fsdp2_state_bytes(
        parameters=parameters,
        trainable=trainable,
        world_size=world_size,
        optimizer_bytes_per_param=optimizer_bytes_per_param,
        offload=offload,
    )
    w = gathered_dtype_bytes(precision)
    blocks = block_parameters * num_layers
    root = max(parameters - blocks, 0.0)
    live_blocks = blocks if not reshard_after_forward else min(1, num_layers) * block_parameters
    earlier = states.gradients if grad_accum > 1 else 0.0
    base = {"parameters": states.parameters, "optimizer_states": states.optimizer_states}
    root_grads = w * min(root, trainable)
    root_shard = SHARD_BYTES * min(root, trainable) / max(world_size, 1)
    # over the reduce's own holdings: the root's sharded gradient comes after (but under
    # accumulation the earlier micro-batches' is there); the first block's reduce-scatter input
    # and output are still held (FSDP2 keeps the last reduce-scatter's until the next)
    tied = (
        3 * w * tied_parameters
        - root_grads
        - (root_shard if grad_accum == 1 else 0.0)
        + w * block_parameters * (1 + 1 / max(world_size, 1))
        if tied_parameters
        else 0.0
    )
    moments: ZeroMoments = {
        "backward": {
            **base,
            "parameters": states.parameters + w * (root + live_blocks),
            "gradients": earlier,
            # the first gradient (the largest parameter's, a head's), once the loss's are gone
            "temporaries": w * largest_parameter,
        },
        "reduce": {
            **base,
            "parameters": states.parameters + w * root,
            "gradients": states.gradients + root_grads,
            "temporaries": max(SHARD_BYTES * min(root, trainable), tied),
        },
        "optimizer": {**base, "gradients": states.gradients, "temporaries": 0.0},
    }
    if num_layers >= 2 and block_parameters:
        rs = SHARD_BYTES * block_parameters * (1 + 1 / max(world_size, 1) + (1 if gloo else 0))
        # stage 3: the next block and its all-gather buffer; else every block but the last
        gathered = block_parameters * (2 if reshard_after_forward else num_layers - 1)
        moments["block_reduce"] = {
            **base,
            "parameters": states.parameters + w * (root + gathered),
            "gradients": earlier,
            "temporaries": w * largest_parameter + rs,
        }
    if checkpoint_blocks and num_layers:
        prefetched = block_parameters if reshard_after_forward else 0.0
        later = SHARD_BYTES * min(blocks - block_parameters, trainable) / max(world_size, 1)
        moments["recompute"] = {
            **base,
            "parameters": moments["backward"]["parameters"] + w * prefetched,
            "gradients": max(earlier, later) + root_grads,
            "temporaries": 0.0,
        }
    return moments


def fsdp2_moments(facts: ModelFacts, plan: Plan) -> ZeroMoments | None:
    """:func:`fsdp2_engine_bytes` for an ``engine=fsdp2`` plan, ``None`` for any other.

    Without a known block stack the whole model is one root group (gathered all through).
    On a CPU device offloading frees nothing: the host is the device.
    """
    if plan.engine != "fsdp2":
        return None
    block = float(facts.block_parameters or 0) if facts.num_layers else 0.0
    return fsdp2_engine_bytes(
        parameters=facts.parameters,
        trainable=facts.trainable_parameters,
        precision=plan.precision,
        world_size=plan.world_size,
        reshard_after_forward=plan.reshard_after_forward,
        block_parameters=block,
        num_layers=facts.num_layers if block else 0,
        grad_accum=plan.grad_accum,
        optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
        offload=plan.offload_param != "none" and facts.device_type != "cpu",
        checkpoint_blocks=plan.checkpoint_blocks,
        tied_parameters=facts.largest_tied_parameters,
        largest_parameter=facts.largest_parameter,
        gloo=facts.device_type == "cpu",
    )


def fsdp2_states_for(facts: ModelFacts, plan: Plan) -> StateBytes:
    """Sharded model states per rank for an ``engine=fsdp2`` plan."""
    return fsdp2_state_bytes(
        parameters=facts.parameters,
        trainable=facts.trainable_parameters,
        world_size=plan.world_size,
        optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
        offload=plan.offload_param != "none" and facts.device_type != "cpu",
    )


def plan_states(facts: ModelFacts, plan: Plan) -> StateBytes:
    """Model states per device for any plan: FSDP2's accounting or ``_zero.states_for``."""
    return fsdp2_states_for(facts, plan) if plan.engine == "fsdp2" else states_for(facts, plan)
