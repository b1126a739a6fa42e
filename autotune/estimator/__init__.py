"""The estimate stage: pure arithmetic that predicts any plan's memory and time before it runs.

Where to change what: the ZeRO model-state, bucket, communication and offload formulas live in
``_zero.py`` (their one home; the collectives each engine issues and their time on a link in ``_comm.py``), FSDP2's (``engine=fsdp2``) in ``_fsdp.py``; activations, FLOPs and step time in ``_costmodel.py``; the peak's
moments in ``_peakmodel.py``; facts read from a profile in ``_modelfacts.py``; claim checks in
``_claims.py`` (throughput against FLOPs per token in ``_throughput.py``, the GPU peak table in
``_device_flops.py``, with the cuBLAS workspace assumed where no GPU is here; the physical bounds of a profile's figures in ``_bounds.py``); the per-plan
estimator and its records in ``_estimator.py``. No torch.
"""

from __future__ import annotations

from autotune.estimator._bounds import (
    BF16_RATIO_FIGURE,
    FACT_OF_FIGURE,
    HFU_FIGURE,
    MFU_FIGURE,
    SPREAD_FIGURE,
    bf16_ratio_problem,
    check_figures,
    flagged_figures,
)
from autotune.estimator._claims import (
    Claim,
    ClaimCheck,
)
from autotune.estimator._comm import (
    Calls,
    Link,
    bus_bytes,
    collective_seconds,
    fit_link,
    link_measure,
    measured_link,
    plan_link,
    step_calls,
    step_communication,
)
from autotune.estimator._costmodel import (
    train_days,
)
from autotune.estimator._device_flops import (
    PEAK_DTYPE,
    assumed_cublas_workspace,
    device_peak_flops,
    table_peak_flops,
)
from autotune.estimator._engine_cost import (
    STACK_WIDTH,
    WIDE_WIDTHS,
    EngineStack,
    engine_key,
    engine_keys,
    engine_seconds,
    engine_stacks,
    fit_engine_cost,
    stack_communication,
    stack_optimizer_scale,
    stack_plan,
    wide_width,
)
from autotune.estimator._estimator import (
    STEP_SECONDS_BAND,
    EstimateRecord,
    PlanEstimate,
    estimate,
    estimate_plan,
    host_bytes_per_node,
    offload_seconds,
    plan_grid,
)
from autotune.estimator._modelfacts import (
    ActivationSpec,
    ModelFacts,
    Source,
    TracedMoment,
    bf16_ratio,
    facts_from_profile,
    fit_step_time,
    with_activations,
)
from autotune.estimator._offload import HostBytes, host_bytes_per_rank
from autotune.estimator._peakmodel import (
    CATEGORIES,
    moments,
)
from autotune.estimator._zero import (
    BUCKET_SIZE,
    STAGE3_PERSISTENCE_THRESHOLD,
    bucket_elements,
    offload_bytes_per_step,
)

__all__ = [
    "Calls",
    "Link",
    "bus_bytes",
    "collective_seconds",
    "fit_link",
    "link_measure",
    "measured_link",
    "plan_link",
    "step_calls",
    "step_communication",
    "STACK_WIDTH",
    "WIDE_WIDTHS",
    "EngineStack",
    "engine_key",
    "engine_keys",
    "engine_seconds",
    "engine_stacks",
    "fit_engine_cost",
    "stack_communication",
    "stack_optimizer_scale",
    "stack_plan",
    "wide_width",
    "BF16_RATIO_FIGURE",
    "FACT_OF_FIGURE",
    "HFU_FIGURE",
    "MFU_FIGURE",
    "SPREAD_FIGURE",
    "ActivationSpec",
    "BUCKET_SIZE",
    "CATEGORIES",
    "Claim",
    "ClaimCheck",
    "EstimateRecord",
    "HostBytes",
    "ModelFacts",
    "PEAK_DTYPE",
    "assumed_cublas_workspace",
    "PlanEstimate",
    "STEP_SECONDS_BAND",
    "STAGE3_PERSISTENCE_THRESHOLD",
    "Source",
    "TracedMoment",
    "bf16_ratio_problem",
    "bucket_elements",
    "check_figures",
    "device_peak_flops",
    "estimate",
    "estimate_plan",
    "facts_from_profile",
    "fit_step_time",
    "bf16_ratio",
    "flagged_figures",
    "host_bytes_per_node",
    "host_bytes_per_rank",
    "moments",
    "offload_bytes_per_step",
    "offload_seconds",
    "plan_grid",
    "table_peak_flops",
    "train_days",
    "with_activations",
]
