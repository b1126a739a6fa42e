"""Questions the seeds raise, answered by formula: is a stated memory possible, do a stated
throughput and TFLOPS agree with each other and with the device's peak, how many days.

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.estimator import _costmodel as cm
from autotune.estimator import _zero as zero
from autotune.estimator._device_flops import PEAK_DTYPE, device_peak_flops
from autotune.estimator._modelfacts import ModelFacts
from autotune.estimator._throughput import ThroughputCheck, check_throughput, plan_flops_per_token
from autotune.records import AutotuneError, Plan
from autotune.records import Record as _Record


@dataclass(frozen=True)
class Claim:
    """One row of a table to check: a plan and what the row states (``None``: not stated).

    Attributes:
        plan: the row's plan (devices, stage, offload, checkpointed blocks).
        text: the row as the user wrote it.
        memory_bytes: claimed memory per device.
        tokens_per_s: claimed tokens per second per device.
        tflops: claimed TFLOP/s per device.
        mfu: claimed model FLOPs utilisation.
        device: a GPU named in :data:`DENSE_PEAKS` (its peak bounds the row).
        peak_flops: the peak FLOP/s per device when no ``device`` is named.
        peak_dtype: which peak of ``device`` (default: the plan precision's).
    """

    plan: Plan
    text: str = ""
    memory_bytes: int | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    device: str | None = None
    peak_flops: float | None = None
    peak_dtype: str | None = None


class MemoryCheck(_Record):
    """Whether a stated per-device memory can hold the plan's model states at all."""

    claimed_bytes: int
    floor_bytes: int
    floor_parameters: int
    floor_gradients: int
    floor_optimizer_states: int
    possible: bool
    explanation: str
    source: Literal["formula"] = "formula"


class ClaimCheck(_Record):
    """One checked row: its memory and throughput parts, and whether it can be true."""

    claim: str
    plan: Plan
    memory: MemoryCheck | None = None
    throughput: ThroughputCheck | None = None
    possible: bool
    explanation: str


def plan_train_days(
    facts: ModelFacts,
    plan: Plan,
    ratio: float | None,
    tokens: int,
    *,
    mfu: float | None = None,
    peak_flops: float | None = None,
) -> tuple[float | None, str]:
    """Days to train ``tokens`` with a plan, and how the throughput was obtained.

    A measured baseline's tokens/s is scaled by the plan's tokens per step and
    predicted step time (same precision only); otherwise an assumed MFU of the
    device's peak FLOPs gives the throughput (:func:`plan_flops_per_token`, the
    recomputation of checkpointed blocks counted as extra hardware work).
    """
    base = facts.baseline
    if mfu is None and base and base.tokens_per_s and ratio:
        samples = plan.micro_batch * plan.grad_accum * plan.world_size
        base_samples = base.plan.micro_batch * base.plan.grad_accum * base.plan.world_size
        rate = base.tokens_per_s * samples / base_samples / ratio
        return cm.train_days(tokens, rate), "measured tokens/s x predicted step time"
    peak = peak_flops or facts.peak_flops_per_s
    if mfu is None or peak is None or not facts.seq_len:
        return (
            None,
            "needs a measured throughput, or --mfu with a peak FLOP rate and a sequence length",
        )
    _, hardware = plan_flops_per_token(facts, plan.checkpoint_blocks)
    # The assumed utilisation covers the recomputed forwards too.
    rate = cm.tokens_per_second_at_mfu(mfu, peak, plan.world_size, hardware)
    return cm.train_days(tokens, rate), f"MFU {mfu:g} of {peak / 1e12:g} TFLOPS per device"


def check_memory(facts: ModelFacts, plan: Plan, claimed_bytes: int) -> MemoryCheck:
    """Whether ``claimed_bytes`` per device can hold the plan's model states at all.

    The floor is the ZeRO paper's (2 + 2 + 12) psi sharded by the plan's stage,
    less what offload moves off the device; activations only add to it.
    """
    floor = zero.paper_floor(facts.parameters, plan.zero_stage, plan.world_size)
    params = 0.0 if plan.offload_param != "none" else floor.parameters
    optimizer = 0.0 if plan.offload_optimizer != "none" else floor.optimizer_states
    total = params + floor.gradients + optimizer
    possible = claimed_bytes >= total
    verdict = "possible" if possible else "impossible"
    n = plan.world_size
    explanation = (
        f"{verdict}: model states alone need at least {total / 1e9:.2f} GB per device "
        f"(ZeRO paper floor for psi={facts.parameters / 1e9:.3g}B, stage {plan.zero_stage}, "
        f"N={n}: parameters {params / 1e9:.2f} GB + gradients {floor.gradients / 1e9:.2f} GB "
        f"+ optimizer states {optimizer / 1e9:.2f} GB), claimed {claimed_bytes / 1e9:.2f} GB; "
        "formula, not a measurement"
    )
    return MemoryCheck(
        claimed_bytes=claimed_bytes,
        floor_bytes=round(total),
        floor_parameters=round(params),
        floor_gradients=round(floor.gradients),
        floor_optimizer_states=round(optimizer),
        possible=possible,
        explanation=explanation,
    )


def check_claim(facts: ModelFacts, claim: Claim) -> ClaimCheck:
    """Check every figure a row states: memory against the floor, throughput against physics.

    Raises:
        AutotuneError: the row states nothing to check, or throughput without a
            sequence length and hidden size to count FLOPs with.
    """
    memory = None
    if claim.memory_bytes is not None:
        memory = check_memory(facts, claim.plan, claim.memory_bytes)
    throughput = None
    if any(v is not None for v in (claim.tokens_per_s, claim.tflops, claim.mfu)):
        peak, dtype = claim_peak(claim)
        throughput = check_throughput(
            facts, claim.plan, tokens_per_s=claim.tokens_per_s, tflops=claim.tflops,
            mfu=claim.mfu, peak_flops=peak, device=claim.device, peak_dtype=dtype,
        )  # fmt: skip
    if memory is None and throughput is None:
        raise AutotuneError(
            f"--check {claim.text!r}: states nothing to check "
            "(memory=, tokens_per_s=, tflops= or mfu=)"
        )
    parts = [memory.explanation] if memory else []
    parts += throughput.findings if throughput else []
    possible = (memory is None or memory.possible) and (
        throughput is None
        or (throughput.consistent is not False and throughput.under_peak is not False)
    )
    return ClaimCheck(
        claim=claim.text,
        plan=claim.plan,
        memory=memory,
        throughput=throughput,
        possible=possible,
        explanation="; ".join(parts),
    )


def claim_peak(claim: Claim) -> tuple[float | None, str | None]:
    """The peak FLOP/s bounding a row and the dtype it is for (``None``: no peak known)."""
    dtype = claim.peak_dtype or PEAK_DTYPE[claim.plan.precision]
    if claim.device is not None:
        return device_peak_flops(claim.device, dtype, "--check device"), dtype
    return claim.peak_flops, (dtype if claim.peak_flops else None)
