"""The profile record: what ``autotune profile`` measured, as a validated, versioned schema.

Every figure is in bytes, seconds or FLOPs. ``None`` always means "not measured
here" and comes with a reason in ``unavailable``; it is never a stand-in for 0.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from autotune.records._base import Record as _Record

SCHEMA_VERSION = 1


class ProfileConfig(_Record):
    """The options the profile ran with."""

    batch_size: int = Field(ge=1)
    precision: Literal["fp32", "bf16", "fp16"] = Field(description="autocast dtype; fp32 = none")
    checkpointing: bool
    steps: int = Field(ge=1, description="measured (timed) steps")
    warmup: int = Field(ge=0, description="steps run first and dropped")
    device: str = Field(description="torch device type the steps ran on: cpu or cuda")


class BlockStack(_Record):
    """The model's repeated stack of blocks (e.g. transformer layers)."""

    path: str = Field(description="dotted name of the ModuleList, e.g. model.layers")
    count: int = Field(ge=1, description="L, the number of blocks")
    block_class: str
    block_parameters: int | None = Field(
        None, ge=0, description="parameters of one block (None: not counted)"
    )


class ModelInfo(_Record):
    """What the model is, counted from its parameters."""

    class_name: str
    parameters: int = Field(ge=0, description="all parameters, shared storages once")
    trainable_parameters: int = Field(ge=0)
    embedding_parameters: int = Field(0, ge=0, description="input embedding tables (no FLOPs)")
    largest_layer_parameters: int = Field(0, ge=0, description="largest single module's own params")
    largest_tied_parameters: int = Field(
        0, ge=0, description="the largest parameter several modules share (a tied head), 0: none"
    )
    parameter_sizes: list[int] | None = Field(
        None,
        description="each trainable parameter's element count, in the order an optimizer takes "
        "them (where ZeRO's flat partitions cut); None: not recorded",
    )
    block_stack: BlockStack | None = None
    tokens_per_sample: int | None = Field(None, description="from input_ids or TOKENS_PER_SAMPLE")
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_layers: int | None = None
    attention: str | None = Field(
        None, description="attention implementation of a transformers model (eager, sdpa, ...)"
    )


class ModuleBytes(_Record):
    """Activation bytes saved for backward inside one module."""

    module: str
    bytes: int = Field(ge=0)


class ActivationFit(_Record):
    """Activations as fixed + per-sample parts, measured at two batch sizes.

    ``bytes(b) = fixed + per_sample * b`` for the whole step and for one block
    of the stack; ``block_input_per_sample`` is what a checkpointed block keeps.
    """

    batch_sizes: tuple[int, int]
    fixed: int
    per_sample: float
    block_fixed: int | None = None
    block_per_sample: float | None = None
    block_input_per_sample: float | None = None
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"


FigureSource = Literal["measured", "traced", "formula"]
"""Where a figure came from: a real step, a trace on fake tensors, or a formula."""


class ActivationRecord(_Record):
    """Saved-for-backward bytes of one precision: ``fixed + per_sample * b``, whole model and per
    block, with where they came from. A profile keeps the figures it traced for the precisions it
    did not run; the estimator reads them (and its own measured ones) as ``ActivationSpec``."""

    fixed: float
    per_sample: float
    block_fixed: float = 0.0
    block_per_sample: float = 0.0
    block_input_fixed: float = 0.0
    block_input_per_sample: float = 0.0
    autocast_weight_copies: float = Field(
        default=0.0, description="16-bit weight copies autocast saves, no block checkpointed"
    )
    block_autocast_weight_copies: float = Field(
        default=0.0, description="of those, one block's (not saved when it is checkpointed)"
    )
    source: FigureSource
    path: str | None = Field(
        default=None,
        description="how a trace got them (autotune.runtime.trace.PATHS); None: a profile",
    )
    temporaries_vs_fp32: float | None = Field(
        default=None,
        description="16-bit weights: the temporaries live at the peak of a forward and backward "
        "(the loss's gradient buffers) over fp32's, both traced; None: not traced",
    )

    def weight_copies(self, blocks: int, checkpoint_blocks: int) -> float:
        """Autocast's weight copies at their highest with k blocks checkpointed: a
        checkpointed block's are dropped, one block's come back during its recompute.
        """
        k = min(checkpoint_blocks, blocks)
        dropped = (k - (1 if k else 0)) * self.block_autocast_weight_copies
        return max(self.autocast_weight_copies - dropped, 0.0)


class AtPeak(_Record):
    """What was live at the moment of the peak; the parts add up to ``peak``."""

    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_states: int = 0
    activations: int = 0
    autocast_weight_copies: int = 0
    temporaries: int = 0


class MemoryBreakdown(_Record):
    """Memory by category (bytes)."""

    parameters: int = Field(ge=0)
    buffers: int = Field(0, ge=0)
    gradients: int = Field(ge=0, description="follows the trainable parameters")
    optimizer_states: int = Field(ge=0, description="read from the optimizer after one step")
    optimizer_step: Literal["single_tensor", "foreach", "fused"] | None = Field(
        None,
        description="how the optimizer steps (torch's fused / foreach / single-tensor path): its "
        "step's transients follow; None: not known",
    )
    activations: int = Field(ge=0, description="saved for backward, unique storages, no params")
    autocast_weight_copies: int = Field(0, ge=0, description="16-bit weight copies autocast saves")
    activations_by_module: list[ModuleBytes] = Field(default_factory=list)
    activation_fit: ActivationFit | None = None
    peak: int = Field(ge=0)
    peak_source: Literal["cuda_max_allocated", "cpu_allocator", "cpu_live_tensors"] = Field(
        description="cpu_allocator: c10's CPU allocator over a plain step (oneDNN's scratch "
        "included), the excess over the tracked tensors in at_peak.temporaries"
    )
    at_peak: AtPeak
    live_tensor_peak: int | None = Field(
        None,
        ge=0,
        description="the live-tensor tracker's own peak, where peak_source is cpu_allocator",
    )
    backward_peak: int | None = Field(
        None,
        ge=0,
        description="live tensor bytes at their most during the backward passes alone (the "
        "start of backward: activations, the loss's gradient buffers), for a step that peaks later",
    )
    backward_at_peak: AtPeak | None = Field(
        None, description="what was live at backward_peak, by category"
    )
    cuda_reserved: int | None = None
    process_rss: int | None = None
    fits_judged_on: str = Field(description="which figure a budget check uses")
    traced: dict[str, ActivationRecord] = Field(
        default_factory=dict,
        description="plan precision -> activation figures traced on fake tensors for the "
        "precisions the profile did not run, so every road that reads this profile predicts "
        "those plans from the same figures; empty: none traced (a script's profile, an older "
        "record)",
    )


class Spread(_Record):
    """Distribution of the measured step times (seconds)."""

    min: float
    p25: float
    median: float
    p75: float
    max: float


class StepTime(_Record):
    """Seconds per step, medians over the measured steps."""

    step: float
    dataloader: float
    forward: float
    backward: float
    optimizer: float
    spread: Spread
    steps_measured: int
    bf16_over_fp32: float | None = Field(
        None,
        gt=0,
        description="measured: the model's forward and backward of one micro-batch in bf16 "
        "autocast over fp32, the median over up to three timed steps each paired with a pass at "
        "the other precision run right after it; <1: bf16 is faster; None: not measured (see "
        "environment.unavailable)",
    )
    block_forward_share: dict[
        Literal["fp32", "bf16", "fp16"], Annotated[float, Field(ge=0, le=1)]
    ] = Field(
        default_factory=dict,
        description="measured: the share of a micro-batch's forward spent in the block stack "
        "(the first block's call to the last one's return), by precision: the profile's own (the "
        "median over the timed steps) and its bf16 / fp32 counterpart's (over the paired passes); "
        "what recomputing the checkpointed blocks costs; empty: no block stack, or an older profile",
    )
    ops_per_micro_batch: int | None = Field(
        None,
        ge=0,
        description="the aten operators one micro-batch's forward and backward dispatched, "
        "counted in the first warm-up step; None: not counted",
    )
    seconds_per_op: float | None = Field(
        None,
        gt=0,
        description="measured on the device: seconds per aten operator of a 4x4 Linear's forward "
        "and backward in a loop (dispatch, autograd and Python, next to no compute); None: not "
        "measured",
    )
    one_thread_over_all: float | None = Field(
        None,
        gt=0,
        description="measured on a CPU: the model's forward and backward on one thread over the "
        "same on the profile's threads, the median of paired passes, where its operators' own "
        "cost may matter (a second micro-batch was timed); a rank given fewer of the cores is "
        "scaled by it (Amdahl's law through the two points), else linearly; None: not measured",
    )


class Throughput(_Record):
    samples_per_s: float
    tokens_per_s: float | None = None


class Compute(_Record):
    """FLOPs per step and utilisation."""

    flops_per_step: float | None = Field(description="model FLOPs (no recomputation)")
    hardware_flops_per_step: float | None = Field(None, description="with recomputation")
    achieved_flops_per_s: float | None = None
    peak_flops_per_s: float | None = None
    peak_source: Literal["table", "measured_matmul"] | None = None
    mfu: float | None = None
    hfu: float | None = None
    note: str | None = None


class Capabilities(_Record):
    """What the device can do, as the policy needs it."""

    bf16_supported: bool
    fp16_supported: bool
    bf16_fp32_speed_ratio: float | None = Field(None, description=">1: bf16 matmul is faster")
    sdpa_available: bool
    flash_attn_available: bool
    compute_capability: str | None = None


class NvmlSample(_Record):
    gpu_utilization_percent: float
    memory_used_bytes: int
    samples: int


class Environment(_Record):
    device_type: str
    device_name: str
    device_count: int
    device_memory_bytes: int | None = None
    torch_version: str
    cuda_version: str | None = None
    deepspeed_version: str | None = None
    capabilities: Capabilities
    nvml: NvmlSample | None = None
    threads: int | None = Field(
        default=None,
        description="torch's intra-op threads the measured steps ran on (a CPU device's share "
        "of its cores); None: not recorded",
    )
    cores: int | None = Field(
        default=None,
        description="the CPU cores the profiling process could run on (its affinity): what a "
        "node's ranks share on a CPU device; None: not recorded",
    )
    host_adam_per_s: float | None = Field(
        default=None,
        description="elements per second torch's fused Adam steps on this machine's CPU (a "
        "16 Mi-element probe): the rate an offloaded optimizer step runs at; None: not probed",
    )
    memory_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        description="the GPU's memory bandwidth as NVML reads it (maximum memory clock x 2 x bus "
        "width); None: not a GPU, or NVML could not say",
    )
    pcie_gbps: float | None = Field(
        default=None,
        description="the GPU's host link, Gbit/s one way, from the PCIe generation and width NVML "
        "reports: what an offloaded plan's transfers cross; None: not a GPU, or NVML could not say",
    )
    blas_workspace_bytes: int | None = Field(
        default=None,
        ge=0,
        description="measured on a GPU: bytes cuBLAS's workspaces (one per thread and stream, "
        "the forward's and autograd's) hold from a step's first matmul on, in the allocator's "
        "peak but in no tensor; 0 off CUDA; None: an older record",
    )
    unavailable: dict[str, str] = Field(
        default_factory=dict, description="field -> why it could not be measured here"
    )


class Provenance(_Record):
    command: str
    model_file: str
    model_sha256: str
    created_at: str
    autotune_version: str


class TimedSteps(_Record):
    """A model file's timed steps at one configuration, nothing else measured: what a second
    profile adds to a first (another batch size, or checkpointing switched) for the step-time
    fit, at a fraction of a whole profile's cost."""

    config: ProfileConfig
    time: StepTime


class ProfileRecord(_Record):
    """Everything one ``autotune profile`` run measured."""

    schema_version: int = SCHEMA_VERSION
    config: ProfileConfig
    model: ModelInfo
    memory: MemoryBreakdown
    time: StepTime
    throughput: Throughput
    compute: Compute
    environment: Environment
    provenance: Provenance
    second: TimedSteps | None = Field(
        default=None,
        description="timed steps at a second micro-batch, on the same model in the same process "
        "after the profile, where its operators' own cost may matter: each phase's time then "
        "splits into a fixed part per micro-batch and a part per sample, on every road that "
        "reads this record; null: not taken (the reason printed with the profile)",
    )
    flags: dict[str, str] = Field(
        default_factory=dict,
        description="figure (dotted key, e.g. compute.mfu) -> why it cannot be true: outside its "
        "physical bounds (autotune.estimator's bounds). A flagged figure is shown marked and never "
        "used as evidence; a refused one is null, its reason also in environment.unavailable",
    )
