"""Two questions the seeds raise, answered by formula: is a claimed memory possible, how many days.

Pure: no torch.
"""

from __future__ import annotations

from typing import Literal

from autotune.estimator import _costmodel as cm
from autotune.estimator import _zero as zero
from autotune.estimator._modelfacts import ModelFacts, block_share
from autotune.records import Plan
from autotune.records import Record as _Record


class ClaimCheck(_Record):
    """Whether a stated per-device memory is physically possible for a plan."""

    plan: Plan
    claimed_bytes: int
    floor_bytes: int
    floor_parameters: int
    floor_gradients: int
    floor_optimizer_states: int
    possible: bool
    explanation: str
    source: Literal["formula"] = "formula"


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
    device's peak FLOPs gives the throughput (6 psi + 12 L h s FLOPs per token,
    the recomputation of checkpointed blocks counted as extra hardware work).
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
    per_token = cm.flops_per_token(
        facts.trainable_parameters - facts.embedding_parameters,
        facts.num_layers,
        facts.hidden_size or 0,
        facts.seq_len,
    )
    share = (
        block_share(facts) * plan.checkpoint_blocks / facts.num_layers if facts.num_layers else 0.0
    )
    recompute = 1.0 + share / 3.0  # one more forward (1/3 of the work) of the recomputed share
    rate = cm.tokens_per_second_at_mfu(mfu, peak, plan.world_size, per_token * recompute)
    return cm.train_days(tokens, rate), f"MFU {mfu:g} of {peak / 1e12:g} TFLOPS per device"


def check_claim(facts: ModelFacts, plan: Plan, claimed_bytes: int) -> ClaimCheck:
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
    return ClaimCheck(
        plan=plan,
        claimed_bytes=claimed_bytes,
        floor_bytes=round(total),
        floor_parameters=round(params),
        floor_gradients=round(floor.gradients),
        floor_optimizer_states=round(optimizer),
        possible=possible,
        explanation=explanation,
    )
