"""The estimate stage: pure arithmetic that predicts any plan's memory and time before it runs.

Where to change what: the ZeRO model-state, bucket, communication and offload formulas live in
``_zero.py`` (their one home); activations, FLOPs and step time in ``_costmodel.py``; the peak's
moments in ``_peakmodel.py``; facts read from a profile in ``_modelfacts.py``; claim checks in
``_claims.py``; the per-plan estimator and its records in ``_estimator.py``. No torch.
"""

from __future__ import annotations

from autotune.estimator._claims import ClaimCheck, check_claim, plan_train_days
from autotune.estimator._costmodel import (
    ADAM_STATE_BYTES,
    SECONDS_PER_DAY,
    WEIGHT_BYTES,
    Accounting,
    ActivationFigures,
    BaselineTime,
    activation_peak,
    communicated_bytes_per_element,
    flops_per_token,
    saved_activations,
    step_seconds,
    tokens_per_second_at_mfu,
    train_days,
    transfer_seconds,
)
from autotune.estimator._estimator import (
    DEFAULT_MARGIN,
    MARGIN_NOTE,
    EstimateRecord,
    MemoryEstimate,
    PlanEstimate,
    estimate,
    estimate_plan,
    plan_grid,
)
from autotune.estimator._modelfacts import (
    ActivationSpec,
    Baseline,
    ModelFacts,
    Source,
    TracedMoment,
    activation_spec,
    block_share,
    facts_from_profile,
    fit_step_time,
)
from autotune.estimator._peakmodel import CATEGORIES, Moments, moments, predict_peak
from autotune.estimator._zero import (
    BUCKET_ALIGNMENT,
    BUCKET_SIZE,
    PAPER_K,
    StateBytes,
    bucket_bytes,
    bucket_elements,
    communication_elements,
    is_deepspeed,
    model_state_bytes,
    offload_bytes_per_step,
    paper_floor,
    states_for,
    zero_bucket_bytes,
)

__all__ = [
    "ADAM_STATE_BYTES",
    "Accounting",
    "ActivationFigures",
    "ActivationSpec",
    "BUCKET_ALIGNMENT",
    "BUCKET_SIZE",
    "Baseline",
    "BaselineTime",
    "CATEGORIES",
    "ClaimCheck",
    "DEFAULT_MARGIN",
    "EstimateRecord",
    "MARGIN_NOTE",
    "MemoryEstimate",
    "ModelFacts",
    "Moments",
    "PAPER_K",
    "PlanEstimate",
    "SECONDS_PER_DAY",
    "Source",
    "StateBytes",
    "TracedMoment",
    "WEIGHT_BYTES",
    "activation_peak",
    "activation_spec",
    "block_share",
    "bucket_bytes",
    "bucket_elements",
    "check_claim",
    "communicated_bytes_per_element",
    "communication_elements",
    "estimate",
    "estimate_plan",
    "facts_from_profile",
    "fit_step_time",
    "flops_per_token",
    "is_deepspeed",
    "model_state_bytes",
    "moments",
    "offload_bytes_per_step",
    "paper_floor",
    "plan_grid",
    "plan_train_days",
    "predict_peak",
    "saved_activations",
    "states_for",
    "step_seconds",
    "tokens_per_second_at_mfu",
    "train_days",
    "transfer_seconds",
    "zero_bucket_bytes",
]
