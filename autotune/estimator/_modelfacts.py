"""Model facts: what the estimator knows about a model, measured (a profile) or traced.

Pure: no torch. The trace side lives in ``autotune.runtime.trace``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autotune.estimator import _costmodel as cm
from autotune.records import (
    AUTOCAST_PLAN_PRECISION,
    ActivationRecord,
    AtPeak,
    FigureSource,
    Plan,
    ProfileRecord,
    TimedSteps,
)
from autotune.records import Record as _Record

Source = FigureSource


class ActivationSpec(ActivationRecord):
    """Saved-for-backward bytes of one precision (:class:`ActivationRecord`), as the cost model
    reads them."""

    def figures(self, blocks: int) -> cm.ActivationFigures:
        """The cost model's view of these figures for a stack of ``blocks`` blocks."""
        return cm.ActivationFigures(
            fixed=self.fixed,
            per_sample=self.per_sample,
            blocks=blocks if self.block_per_sample or self.block_fixed else 0,
            block_fixed=self.block_fixed,
            block_per_sample=self.block_per_sample,
            block_input_fixed=self.block_input_fixed,
            block_input_per_sample=self.block_input_per_sample,
        )


class TracedMoment(_Record):
    """The peak of one whole training step traced on fake tensors (nothing allocated).

    Forward, backward and the optimizer step of ``plan`` ran under ``FakeTensorMode``
    with the profile's own live-tensor tracker, so the temporaries (the loss's
    gradient buffers, the optimizer's transients) are traced, not assumed zero.
    """

    plan: Plan
    peak: int
    at_peak: AtPeak
    optimizer_temporaries: float | None = Field(
        default=None,
        description="the optimizer step's transient bytes, from a smaller traced step that peaked "
        "there (this one peaked in backward); None: not traced",
    )
    backward_at_peak: AtPeak | None = Field(
        default=None,
        description="what was live at the backward's own peak, as a profile records it",
    )
    optimizer_step: Literal["single_tensor", "foreach", "fused"] | None = Field(
        default=None, description="the model file's optimizer's step path where it sets one"
    )


ONE_PROFILE_FIT = "each phase proportional to the micro-batch (one profile)"
"""How a baseline's phases scale with the micro-batch before a second profile or timed steps at
another batch split them (:func:`fit_step_time`)."""


class Baseline(_Record):
    """A measured plan: its peak and what was live then, and its step time by phase."""

    plan: Plan
    peak: int
    at_peak: AtPeak
    dataloader: float
    forward: float
    backward: float
    optimizer: float
    tokens_per_s: float | None = None
    backward_at_peak: AtPeak | None = Field(
        default=None,
        description="what was live at the backward's own peak, where the step peaked later",
    )
    dataloader_fixed: float = Field(default=0.0, description="per micro-batch, batch-independent")
    forward_fixed: float = 0.0
    backward_fixed: float = 0.0
    recompute_share: float | None = Field(
        default=None, description="measured: recomputing one block costs this share of a forward"
    )
    block_forward_share: dict[str, float] = Field(
        default_factory=dict,
        description="measured: the block stack's share of a forward, by the precision its "
        "matmuls ran in (fp32, bf16); recomputing a checkpointed block costs 1/L of it",
    )
    recompute_fixed: float = Field(
        default=0.0,
        description="measured: seconds per checkpointed block beyond its share of the forward",
    )
    time_fit: str = Field(
        default=ONE_PROFILE_FIT,
        description="how each phase's seconds per micro-batch were fitted, as the estimate says",
    )
    host_adam_per_s: float | None = Field(
        default=None, description="measured: elements per second the host's CPU steps Adam at"
    )
    threads: int | None = Field(
        default=None, description="the CPU threads the measured steps ran on (a CPU device)"
    )
    cores: int | None = Field(
        default=None, description="the CPU cores the profiling process could run on"
    )
    one_thread_over_all: float | None = Field(
        default=None,
        gt=0,
        description="measured: the forward and backward on one thread over the same on "
        "``threads`` (a CPU device); None: not measured, compute taken as linear in threads",
    )
    bf16_speed_ratio: float | None = Field(
        default=None,
        description="measured: a bf16 matmul's speed over an fp32 one's on the profiled device "
        "(a plan at the other precision has its compute scaled by it); None: not measured, or "
        "flagged impossible",
    )
    bf16_over_fp32: float | None = Field(
        default=None,
        gt=0,
        description="measured: the model's forward and backward in bf16 autocast over fp32 "
        "(the profile's probe); None: not measured",
    )
    matmul_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="the share of forward and backward the step's FLOPs take at the device's peak "
        "(measured matmul rate or datasheet): the part a faster matmul dtype speeds up (a lower "
        "bound); None: no FLOP count or peak",
    )


class ModelFacts(_Record):
    """What the estimator needs to know about a model, measured or traced."""

    name: str
    parameters: int
    trainable_parameters: int
    embedding_parameters: int = 0
    largest_layer_parameters: int = 0
    largest_tied_parameters: int = Field(
        default=0, description="the largest parameter several modules share; 0: none"
    )
    parameter_sizes: tuple[int, ...] | None = Field(
        default=None,
        description="trainable parameters' element counts in the optimizer's order; None: unknown",
    )
    buffers: int = 0
    block_stack: str | None = None
    num_layers: int = Field(
        default=0, description="L, blocks in the repeated stack (0: none found)"
    )
    block_parameters: int | None = Field(default=None, description="parameters of one block")
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    seq_len: int | None = Field(default=None, description="tokens per sample")
    optimizer_bytes_per_param: float = cm.ADAM_STATE_BYTES
    optimizer_source: Literal["measured", "assumed_adam"] = "assumed_adam"
    optimizer_step: Literal["single_tensor", "foreach", "fused"] | None = Field(
        default=None, description="the profiled optimizer's step path; None: torch's default"
    )
    activations: dict[str, ActivationSpec] = Field(description="plan precision -> figures")
    baseline: Baseline | None = None
    device_type: str | None = Field(
        default=None,
        description="where the plans run (cpu: offloading frees nothing); None = unknown",
    )
    traced_moment: TracedMoment | None = Field(
        default=None, description="a traced whole step; the peak's reference without a profile"
    )
    peak_flops_per_s: float | None = None
    device_workspace: int = Field(
        default=0,
        ge=0,
        description="bytes the device's matmul libraries hold in every plan's peak and in no "
        "tensor (cuBLAS's workspaces on a GPU); in a measured baseline's peak already",
    )
    device_workspace_source: str | None = Field(
        default=None, description="where device_workspace came from (measured, or assumed)"
    )

    @property
    def largest_parameter(self) -> int:
        """Elements of the largest trainable parameter (what a per-parameter optimizer step or
        gradient copy holds at once): from the parameter sizes where recorded, else the largest
        module's own parameters (a bound: a module may hold several, as MoE experts do)."""
        if self.parameter_sizes:
            return max(self.parameter_sizes)
        return self.largest_layer_parameters


def facts_from_profile(profile: ProfileRecord) -> ModelFacts:
    """Model facts with the activation figures, peak and times a profile measured.

    Without a two-batch-size fit the measured activations count as per-sample
    only, and checkpointing cannot be predicted (no per-block figures). The timed steps at a
    second micro-batch the record carries (``second``) split each phase's time into a fixed
    part per micro-batch and a part per sample (:func:`fit_step_time`).
    """
    model, memory, time = profile.model, profile.memory, profile.time
    fit = memory.activation_fit
    batch = profile.config.batch_size
    if fit is not None:
        spec = ActivationSpec(
            fixed=fit.fixed,
            per_sample=fit.per_sample,
            block_fixed=fit.block_fixed or 0,
            block_per_sample=fit.block_per_sample or 0.0,
            block_input_per_sample=fit.block_input_per_sample or 0.0,
            autocast_weight_copies=memory.autocast_weight_copies,
            source="measured",
        )
    else:
        spec = ActivationSpec(
            fixed=0.0,
            per_sample=memory.activations / batch,
            autocast_weight_copies=memory.autocast_weight_copies,
            source="measured",
        )
    layers = model.block_stack.count if model.block_stack else 0
    precision = AUTOCAST_PLAN_PRECISION[profile.config.precision]
    plan = Plan.model_validate(
        {
            "precision": precision,
            "micro_batch": batch,
            "checkpoint_blocks": layers if profile.config.checkpointing else 0,
        }
    )
    trainable = model.trainable_parameters
    facts = ModelFacts(
        name=model.class_name,
        parameters=model.parameters,
        trainable_parameters=trainable,
        embedding_parameters=model.embedding_parameters,
        largest_layer_parameters=model.largest_layer_parameters,
        parameter_sizes=tuple(model.parameter_sizes) if model.parameter_sizes else None,
        largest_tied_parameters=model.largest_tied_parameters,
        buffers=memory.buffers,
        block_stack=model.block_stack.path if model.block_stack else None,
        num_layers=layers,
        block_parameters=model.block_stack.block_parameters if model.block_stack else None,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        seq_len=model.tokens_per_sample,
        optimizer_bytes_per_param=memory.optimizer_states / trainable if trainable else 0.0,
        optimizer_source="measured",
        optimizer_step=memory.optimizer_step,
        activations={
            **{k: ActivationSpec.model_validate(v.model_dump()) for k, v in memory.traced.items()},
            precision: spec,
        },
        baseline=Baseline(
            plan=plan,
            peak=memory.peak,
            at_peak=memory.at_peak,
            backward_at_peak=memory.backward_at_peak,
            dataloader=time.dataloader,
            forward=time.forward,
            backward=time.backward,
            optimizer=time.optimizer,
            tokens_per_s=profile.throughput.tokens_per_s,
            host_adam_per_s=profile.environment.host_adam_per_s,
            threads=profile.environment.threads,
            cores=profile.environment.cores,
            one_thread_over_all=time.one_thread_over_all,
            bf16_speed_ratio=bf16_ratio(profile),
            bf16_over_fp32=time.bf16_over_fp32,
            block_forward_share=dict(time.block_forward_share),
            matmul_share=_matmul_share(profile),
        ),
        peak_flops_per_s=profile.compute.peak_flops_per_s,
        device_type=profile.config.device,
        **_workspace(profile),
    )
    return facts if profile.second is None else fit_step_time(facts, profile.second)


def _workspace(profile: ProfileRecord) -> dict[str, object]:
    """The cuBLAS workspace a GPU profile measured (none recorded, or off a GPU: nothing)."""
    measured = profile.environment.blas_workspace_bytes
    if not measured:
        return {}
    return {
        "device_workspace": measured,
        "device_workspace_source": f"measured by the profile on {profile.environment.device_name}",
    }


def bf16_ratio(profile: ProfileRecord) -> float | None:
    """The profile's measured bf16:fp32 matmul speed, unless its bounds flag it impossible (the
    estimate's time and the policy's ``bf16_speed_ratio`` fact read it)."""
    from autotune.estimator._bounds import BF16_RATIO_FIGURE, flagged_figures

    if BF16_RATIO_FIGURE in flagged_figures(profile):
        return None
    return profile.environment.capabilities.bf16_fp32_speed_ratio


def _matmul_share(profile: ProfileRecord) -> float | None:
    """The measured step's forward and backward share spent in matmuls, were they at the peak:
    its hardware FLOPs over the peak FLOP/s, over those phases' seconds (at most 1)."""
    flops = profile.compute.hardware_flops_per_step or profile.compute.flops_per_step
    peak, time = profile.compute.peak_flops_per_s, profile.time
    compute = time.forward + time.backward
    if not flops or not peak or compute <= 0:
        return None
    return min(1.0, flops / peak / compute)


def with_activations(facts: ModelFacts, specs: dict[str, ActivationSpec]) -> ModelFacts:
    """``facts`` with the activation figures of precisions it lacks taken from ``specs``.

    Figures already there (a profile's, measured) are kept: a trace only fills the precisions
    nothing measured, which :func:`activation_spec` would otherwise derive by formula.
    """
    extra = {k: v for k, v in specs.items() if k not in facts.activations}
    return facts.model_copy(update={"activations": {**facts.activations, **extra}})


def activation_spec(facts: ModelFacts, precision: str) -> tuple[ActivationSpec, str | None]:
    """:func:`_activation_spec`, its note saying which trace path gave the figures."""
    spec, note = _activation_spec(facts, precision)
    paths = sorted({s.path for s in facts.activations.values() if s.path})
    return spec, "; ".join(
        [*([note] if note else []), *(f"activations {p}" for p in paths)]
    ) or None


def _activation_spec(facts: ModelFacts, precision: str) -> tuple[ActivationSpec, str | None]:
    """The activation figures for a plan precision, and a note when they are derived.

    Figures measured or traced at another precision are converted by formula:
    autocast fp16 and bf16 save the same bytes, as do DeepSpeed fp16 and bf16;
    16-bit weights halve fp32's figures; autocast from fp32 keeps fp32's figures
    (an upper bound) plus 16-bit copies of the non-embedding weights.
    """
    acts = facts.activations
    if precision in acts:
        return acts[precision], None
    twin = {"amp_bf16": "amp_fp16", "amp_fp16": "amp_bf16", "bf16": "fp16", "fp16": "bf16"}
    if twin.get(precision) in acts:
        return acts[twin[precision]], f"activations of {precision} taken from {twin[precision]}"
    base_name = "fp32" if "fp32" in acts else next(iter(acts))
    base = acts[base_name]
    if precision in ("bf16", "fp16"):
        factor, copies = (0.5 if base_name == "fp32" else 1.0), 0.0
    elif precision.startswith("amp"):
        factor, copies = 1.0, 2.0 * (facts.parameters - facts.embedding_parameters)
    else:
        factor, copies = (2.0 if base_name in ("bf16", "fp16") else 1.0), 0.0
    spec = ActivationSpec(
        fixed=base.fixed * factor,
        per_sample=base.per_sample * factor,
        block_fixed=base.block_fixed * factor,
        block_per_sample=base.block_per_sample * factor,
        block_input_fixed=base.block_input_fixed * factor,
        block_input_per_sample=base.block_input_per_sample * factor,
        autocast_weight_copies=copies,
        source="formula",
    )
    return spec, f"activations of {precision} by formula from {base_name} x {factor}"


def block_share(facts: ModelFacts) -> float:
    """Share of the forward's compute spent in the block stack (for recompute cost).

    From parameter counts when known (matmul work follows the weights), else
    from the activation figures.
    """
    if not facts.num_layers:
        return 0.0
    if facts.block_parameters:
        dense = max(facts.parameters - facts.embedding_parameters, 1)
        return min(facts.num_layers * facts.block_parameters / dense, 1.0)
    spec = next(iter(facts.activations.values()))
    if spec.per_sample <= 0:
        return 1.0
    return min(facts.num_layers * spec.block_per_sample / spec.per_sample, 1.0)


def matmul_dtype(precision: str) -> str:
    """The dtype a plan precision's matmuls run in: ``bf16`` (bf16 weights or autocast),
    ``fp16`` or ``fp32``; the keys of ``Baseline.block_forward_share``."""
    return (
        precision.removeprefix("amp_") if precision.startswith(("amp_", "bf16", "fp16")) else "fp32"
    )


def measured_block_share(facts: ModelFacts, precision: str | None = None) -> float:
    """The block stack's share of a forward at ``precision`` (a plan's; ``None``: the
    profile's own): fitted from a second profile with checkpointing switched
    (``recompute_share``), else as the profile measured it at that precision's matmuls, else at
    its own, else from the parameter counts (:func:`block_share`)."""
    base = facts.baseline
    if base is None:
        return block_share(facts)
    if base.recompute_share is not None:
        return base.recompute_share * facts.num_layers
    shares = base.block_forward_share
    own = matmul_dtype(base.plan.precision)
    share = shares.get(matmul_dtype(precision or base.plan.precision), shares.get(own))
    return block_share(facts) if share is None else share


def fit_step_time(facts: ModelFacts, other: ProfileRecord | TimedSteps) -> ModelFacts:
    """Refine the baseline's step time with a second profile that differs in one knob.

    At another batch size: each phase (data, forward, backward) per micro-batch
    is fitted as a fixed part plus a part proportional to the batch; the fixed
    part is what one profile cannot see (per-call overheads that dominate small
    models). With checkpointing switched: the measured cost of recomputing a
    block, as a share of the forward (checkpointing's own overheads included).

    Raises:
        ValueError: the profiles differ in precision, or in more than one knob.
    """
    base = facts.baseline
    if base is None:
        raise ValueError("no baseline to refine")
    cfg, time = other.config, other.time
    if AUTOCAST_PLAN_PRECISION[cfg.precision] != base.plan.precision:
        raise ValueError("the second profile has another precision")
    b0, b1 = base.plan.micro_batch, cfg.batch_size
    k0, k1 = base.plan.checkpoint_blocks, facts.num_layers if cfg.checkpointing else 0
    if b0 != b1 and k0 == k1:
        update = _batch_fit(base, b1, time.dataloader, time.forward, time.backward)
    elif b0 == b1 and k0 != k1 and facts.num_layers:
        extra = (time.backward - base.backward) * (1 if k1 > k0 else -1)
        forward = time.forward if k1 > k0 else base.forward
        update = _recompute_fit(facts, max(extra, 0.0) / abs(k1 - k0), forward)
    else:
        raise ValueError("the second profile must differ in batch size or in checkpointing only")
    fitted = str(update.get("time_fit") or f"a block's recompute from a profile at batch {b1}, "
                 f"checkpointing {'on' if cfg.checkpointing else 'off'}")  # fmt: skip
    earlier = [] if base.time_fit == ONE_PROFILE_FIT else [base.time_fit]
    update["time_fit"] = "; ".join([*earlier, fitted])
    return facts.model_copy(update={"baseline": base.model_copy(update=update)})


def _recompute_fit(facts: ModelFacts, per_block: float, forward: float) -> dict[str, object]:
    """Split a checkpointed block's measured extra seconds into recompute and fixed overhead.

    Recomputing a block re-runs its forward: its share of the forward (as the profile measured
    it, else from the parameters: :func:`measured_block_share`), which grows with the
    micro-batch.
    What the profile measured beyond that (the checkpoint's hooks, RNG state,
    graph rebuilt per call) is taken as a fixed cost per block: on the tiny Llama
    here it was 0.045 s for 4 blocks at micro-batch 4 and 0.046 s at 2.
    """
    if forward <= 0 or not facts.num_layers:
        return {"recompute_share": 0.0, "recompute_fixed": per_block}
    physical = measured_block_share(facts) / facts.num_layers * forward
    return {
        "recompute_share": min(per_block, physical) / forward,
        "recompute_fixed": max(per_block - physical, 0.0),
    }


def _batch_fit(
    base: Baseline, b1: int, dataloader: float, forward: float, backward: float
) -> dict[str, object]:
    b0 = base.plan.micro_batch

    def fixed(at_base: float, at_other: float) -> float:
        slope = (at_base - at_other) / (b0 - b1)
        return min(max(at_base - slope * b0, 0.0), at_base)

    return {
        "dataloader_fixed": fixed(base.dataloader, dataloader),
        "forward_fixed": fixed(base.forward, forward),
        "backward_fixed": fixed(base.backward, backward),
        "time_fit": f"fixed + per-sample parts from batch {b0} and {b1}",
    }
