"""Offload's other side: the host memory an offloaded plan needs per node, the one home of that
accounting (DeepSpeed ZeRO-Offload, ZeRO-3 parameter offload, FSDP2's ``CPUOffloadPolicy``).

Pure: no torch. The device side stays in ``_zero.py`` and ``_fsdp.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.estimator._costmodel import ADAM_STATE_BYTES, WEIGHT_BYTES


@dataclass(frozen=True)
class HostBytes:
    """Host bytes one rank's offloaded states take, by part (0 where nothing is offloaded)."""

    master: float = 0.0
    """The fp32 master copy of the rank's partition."""
    optimizer_states: float = 0.0
    """The optimizer's moments on it (Adam: 8 bytes per parameter)."""
    gradients: float = 0.0
    """The fp32 gradient partition the host step reads (and DeepSpeed's 16-bit buffers the
    reduced or accumulated gradients land in)."""
    parameters: float = 0.0
    """Offloaded parameter partitions, and DeepSpeed's 16-bit copy-back buffer of the
    partition (ZeRO-1/2 offload)."""
    buffers: float = 0.0
    """Pinned transfer buffers: ZeRO-1/2's one-parameter gradient buffer."""

    @property
    def total(self) -> float:
        """Every part."""
        return self.master + self.optimizer_states + self.gradients + self.parameters + self.buffers


NONE = HostBytes()


def host_bytes_per_rank(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    zero_stage: int,
    world_size: int,
    engine: str = "deepspeed",
    grad_accum: int = 1,
    largest_parameter: float = 0.0,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> HostBytes:
    """Host bytes of one rank's offloaded states, as the implementation allocates them.

    DeepSpeed 0.19 (``stage_1_and_2.py``, ``stage3.py``), per rank with P = trainable / N:

    - ZeRO-1/2 ``offload_optimizer``: the fp32 master partition (4P, pinned), the optimizer's
      moments on it, the fp32 gradient partition the CPU Adam step reads (4P), a 16-bit
      buffer of the partition that carries the updated weights back (``param_buffer_of_bit16_
      for_cpu_offload_groups``, wP), one largest parameter's gradient buffer
      (``temp_grad_buffer_for_cpu_offload``) and, under accumulation, a 16-bit buffer per
      partition parameter that accumulates its gradient on the host (wP);
    - ZeRO-3 ``offload_optimizer``: the master, the moments, the fp32 gradient partition the
      step reads (4P) and the flat buffer the reduced gradients land in, in the weights' dtype
      (``grad_partitions_flat_buffer``, wP); ``offload_param`` adds the 16-bit parameter
      partition (w x parameters / N);
    - FSDP2's ``CPUOffloadPolicy`` (``offload_param`` of an ``engine=fsdp2`` plan): the fp32
      parameter shards, their gradients and the optimizer's states, all on the host.

    DeepSpeed's CPU Adam steps the partition in place (``cpu_adam``'s tiles reuse the
    partition's own memory): no workspace is counted. A plan that offloads nothing needs
    nothing here.
    """
    n = max(world_size, 1)
    part = trainable / n
    w = WEIGHT_BYTES[precision]
    if engine == "fsdp2":
        if not offload_param:
            return NONE
        return HostBytes(
            master=4.0 * parameters / n,
            optimizer_states=optimizer_bytes_per_param * part,
            gradients=4.0 * part,
        )
    host_params = w * parameters / n if offload_param and zero_stage >= 3 else 0.0
    if not offload_optimizer:
        return HostBytes(parameters=host_params)
    if zero_stage >= 3:
        return HostBytes(
            master=4.0 * part,
            optimizer_states=optimizer_bytes_per_param * part,
            gradients=(4.0 + w) * part,
            parameters=host_params,
        )
    return HostBytes(
        master=4.0 * part,
        optimizer_states=optimizer_bytes_per_param * part,
        gradients=4.0 * part + (w * part if grad_accum > 1 else 0.0),
        parameters=w * part,
        buffers=w * largest_parameter,
    )
