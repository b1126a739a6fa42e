"""Predict memory and time of any plan from model facts: the records and the estimator.

Pure: no torch. Facts come from a saved profile (:func:`facts_from_profile`) or
from a trace without allocation (``autotune.runtime.trace``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pydantic import Field

from autotune.estimator import _costmodel as cm
from autotune.estimator import _zero as zero
from autotune.estimator._claims import Claim, ClaimCheck, check_claim, plan_train_days
from autotune.estimator._comm import step_communication
from autotune.estimator._engine_cost import engine_seconds
from autotune.estimator._modelfacts import (
    ActivationSpec,
    Baseline,
    ModelFacts,
    Source,
    activation_spec,
    facts_from_profile,
    fit_step_time,
    measured_block_share,
)
from autotune.estimator._offload import host_bytes_per_rank
from autotune.estimator._peakmodel import predict_peak
from autotune.records import Machine, Plan
from autotune.records import Record as _Record

__all__ = [
    "ActivationSpec",
    "Baseline",
    "ClaimCheck",
    "EstimateRecord",
    "MemoryEstimate",
    "ModelFacts",
    "PlanEstimate",
    "estimate",
    "estimate_plan",
    "facts_from_profile",
    "fit_step_time",
    "host_bytes_per_node",
    "offload_seconds",
    "plan_grid",
]

SCHEMA_VERSION = 1

NO_BUDGET = Machine()
"""The default machine: no budget (fit unknown), no link speeds."""
MARGIN_NOTE = (
    "fits = predicted peak <= device memory x (1 - margin); the margin covers what tensors "
    "do not show: CUDA context, allocator fragmentation, communication buffers"
)


class MemoryEstimate(_Record):
    """Per-device bytes by category (full sizes) and the predicted peak."""

    parameters: int
    buffers: int
    gradients: int
    optimizer_states: int
    activations: int = Field(description="at their highest: saved set + one recomputed block")
    autocast_weight_copies: int
    temporaries: int
    peak: int
    peak_composition: str


STEP_SECONDS_BAND = (0.84, 1.15)
"""Measured over predicted seconds per step, 10th and 90th percentiles, over bench/step_time.py's
32 GPT-2 small (124M) plans on 2 ranks (ZeRO-0/2/3 and FSDP2 x fp32/bf16 x no/all blocks
checkpointed x accumulation 1/4, one profile at micro-batch 1, the median of two interleaved
measured rounds each, so the machine's noise is in it), with each engine's own work per tensor
and per element measured against the link swept up to 64 MiB: the interval stated beside every
predicted step time. In-sample at that model; bench/step_time.py prints how many plans of each
model fall inside (before the per-element work and the longer sweep, 0.87 and 1.23; the history
is in bench/CHANGELOG.md)."""


def step_seconds_interval(seconds: float | None) -> tuple[float, float] | None:
    """The interval :data:`STEP_SECONDS_BAND` gives a predicted step time (``None``: none)."""
    if seconds is None:
        return None
    return seconds * STEP_SECONDS_BAND[0], seconds * STEP_SECONDS_BAND[1]


class PlanEstimate(_Record):
    """One plan's predicted costs."""

    plan: Plan
    memory: MemoryEstimate
    fits: bool | None = Field(description="None: no device memory budget known")
    headroom_bytes: int | None
    predicted_step_time_ratio: float | None
    predicted_step_seconds: float | None = None
    predicted_step_seconds_interval: tuple[float, float] | None = Field(
        default=None,
        description="where the measured seconds per step fell for most plans of the validation "
        "(STEP_SECONDS_BAND times the predicted seconds); None: seconds not predicted",
    )
    time_source: Source | None
    communication_bytes_per_step: int
    communication_seconds: float | None
    offload_bytes_per_step: int = 0
    host_optimizer_seconds: float | None = Field(
        default=None,
        description="seconds the offloaded optimizer steps on the host's CPU (the profile's "
        "probed Adam rate); None: nothing offloaded, or no rate probed",
    )

    @property
    def samples_per_s_per_device(self) -> float | None:
        """Samples each device trains per second: micro-batch x accumulation / step seconds
        (``None`` where the seconds are not predicted)."""
        seconds, plan = self.predicted_step_seconds, self.plan
        return plan.micro_batch * plan.grad_accum / seconds if seconds else None

    host_bytes_per_node: int = Field(
        default=0,
        description="host RAM the offloaded states take on each node (0: nothing offloaded)",
    )
    host_fits: bool | None = Field(
        default=True, description="those fit the machine's host memory; None: not known"
    )
    accounting: cm.Accounting
    source: Source = Field(description="where the activation figures came from")
    train_days: float | None = None
    notes: list[str] = Field(default_factory=list)


class EstimateRecord(_Record):
    """What ``autotune estimate`` predicts, for one or many plans."""

    schema_version: int = SCHEMA_VERSION
    model: str
    parameters: int
    trainable_parameters: int
    num_layers: int
    seq_len: int | None
    device_memory_bytes: int | None
    budget_source: str | None = Field(
        default=None,
        description="where the budget came from: given, the GPU's (device), this machine's "
        "available memory (available_ram); None: no budget",
    )
    margin: float
    margin_note: str = MARGIN_NOTE
    intra_gbps: float | None = None
    inter_gbps: float | None = None
    baseline: Plan | None = Field(
        default=None, description="the plan step-time ratios are relative to"
    )
    train_tokens: int | None = None
    plans: list[PlanEstimate]
    checks: list[ClaimCheck] = Field(
        default_factory=list, description="stated figures checked against the formulas"
    )


def _baseline_time(facts: ModelFacts, reference: Plan) -> tuple[cm.BaselineTime, Source]:
    """The measured baseline's phases, or a FLOP-proportioned stand-in (forward 1, backward 2)."""
    base = facts.baseline
    layers, share = facts.num_layers, measured_block_share(facts, reference.precision)
    if base is not None:
        time = cm.BaselineTime(
            dataloader=base.dataloader,
            forward=base.forward,
            backward=base.backward,
            optimizer=base.optimizer,
            micro_batch=base.plan.micro_batch,
            grad_accum=base.plan.grad_accum,
            checkpoint_blocks=base.plan.checkpoint_blocks,
            blocks=layers,
            block_share=share,
            recompute_fixed=base.recompute_fixed,
            dataloader_fixed=base.dataloader_fixed,
            forward_fixed=base.forward_fixed,
            backward_fixed=base.backward_fixed,
        )
        return time, "measured"
    time = cm.BaselineTime(
        dataloader=0.0,
        forward=1.0,
        backward=2.0,
        optimizer=0.0,
        micro_batch=reference.micro_batch,
        grad_accum=reference.grad_accum,
        checkpoint_blocks=reference.checkpoint_blocks,
        blocks=layers,
        block_share=share,
    )
    return time, "formula"


def _step_ratio(
    facts: ModelFacts,
    plan: Plan,
    reference: Plan,
    extra_seconds: float,
    host_step: tuple[float | None, str | None],
) -> tuple[float | None, float | None, Source | None, str | None]:
    """Predicted step-time ratio to the reference plan, seconds when measured, source, note.

    ``host_step``: the seconds of an optimizer step offloaded to the host, or why unknown.
    """
    base, source = _baseline_time(facts, reference)
    reference_base, note = base, None
    if source == "measured" and plan.precision != reference.precision:
        factor, note = _precision_factor(facts, reference.precision, plan.precision)
        if factor is None:
            return None, None, None, note
        scaled, per_sample = base.precision_scaled(factor)
        note = f"{note}{_fixed_kept(base, per_sample)}"
        base = replace(scaled, block_share=measured_block_share(facts, plan.precision))
    host_seconds, why = host_step
    if source == "measured" and why:
        return None, None, None, why
    sharded = plan.zero_stage >= 1 and plan.offload_optimizer == "none"
    seconds = cm.step_seconds(
        base.on_cores(cpu_core_share(facts, plan)),
        micro_batch=plan.micro_batch,
        grad_accum=plan.grad_accum,
        checkpoint_blocks=plan.checkpoint_blocks,
        optimizer_scale=1.0 / plan.world_size if sharded else 1.0,
        optimizer_seconds=host_seconds if source == "measured" else None,
        extra_seconds=extra_seconds if source == "measured" else 0.0,
    )
    ref = cm.step_seconds(
        reference_base.on_cores(cpu_core_share(facts, reference)),
        micro_batch=reference.micro_batch,
        grad_accum=reference.grad_accum,
        checkpoint_blocks=reference.checkpoint_blocks,
    )
    return seconds / ref, seconds if source == "measured" else None, source, note


_BF16_MATMULS = {"bf16", "amp_bf16"}
"""Precisions whose matmuls run in bf16 (weights in bf16, or autocast)."""


def _precision_factor(facts: ModelFacts, measured: str, plan: str) -> tuple[float | None, str]:
    """How much longer ``plan``'s forward and backward take than the ``measured`` precision's,
    and the note that says so: as the profile measured the model's own forward and backward in
    bf16 autocast against fp32 (``Baseline.bf16_over_fp32``); else (an older profile) the share
    of them that is matmuls at the device's peak (``Baseline.matmul_share``, all of it where
    unknown) at the profile's bf16:fp32 matmul speed, the rest as measured. ``(None, why)``
    where nothing measured links the two (fp16)."""
    matmuls = {name: "bf16" if name in _BF16_MATMULS else name for name in (measured, plan)}
    if matmuls[measured] == matmuls[plan]:
        return 1.0, (
            f"step time at {plan} from the {measured} profile's: the same bf16 matmuls, "
            "autocast's casts not counted"
        )
    base = facts.baseline
    if base is None or {matmuls[measured], matmuls[plan]} != {"bf16", "fp32"}:
        return None, "step time of another precision needs a profile at that precision"
    if base.bf16_over_fp32 is not None:
        factor = base.bf16_over_fp32 if matmuls[plan] == "bf16" else 1.0 / base.bf16_over_fp32
        return factor, (
            f"step time at {plan} from the {measured} profile's: forward and backward x"
            f"{factor:.2f}, as the profile measured the model's own in bf16 autocast against "
            "fp32; the optimizer's fp32 step unchanged"
        )
    ratio = base.bf16_speed_ratio
    if ratio is None:
        return None, "step time of another precision needs a profile at that precision"
    speed = ratio if matmuls[plan] == "bf16" else 1.0 / ratio
    share = base.matmul_share if base.matmul_share is not None else 1.0
    factor = 1.0 - share + share / speed
    return factor, (
        f"step time at {plan} from the {measured} profile's: forward and backward x{factor:.2f}, "
        f"their matmuls ({share:.0%} of them at the device's peak) at the profile's measured "
        f"bf16:fp32 matmul speed ({ratio:.2f}), the rest and the optimizer's fp32 step unchanged"
    )


def _fixed_kept(base: cm.BaselineTime, per_sample: float | None) -> str:
    """What the precision note adds where :meth:`BaselineTime.precision_scaled` kept the parts
    per micro-batch and scaled the parts per sample by ``per_sample`` (``None``: it scaled all
    of it alike, and the note adds nothing)."""
    if per_sample is None:
        return ""
    fixed = base.forward_fixed + base.backward_fixed
    return (f"; of forward and backward at micro-batch {base.micro_batch}, the "
            f"{fixed * 1e3:.1f} ms of operators' own cost per micro-batch kept as measured, the "
            f"part per sample x{per_sample:.2f}")  # fmt: skip


def cpu_core_share(facts: ModelFacts, plan: Plan) -> float:
    """How much longer a rank's compute takes than the profile's on a CPU device, where a
    node's ranks share its cores: each gets ``threads // ranks per node`` of the threads the
    profile ran on (as the trial launcher sets ``OMP_NUM_THREADS``). Where the profile measured
    one thread against its own (``one_thread_over_all``), by Amdahl's law through those two
    points (a serial share of the work that threads do not split); else linear in threads.
    Ranks whose threads outnumber the node's cores take turns on them (:func:`core_turns`).
    1 on a GPU (a device per rank) or where the threads were not recorded."""
    base = facts.baseline
    threads = base.threads if base else None
    if facts.device_type != "cpu" or not threads or base is None:
        return 1.0
    rank = max(1, threads // plan.nproc_per_node)
    turns = core_turns(facts, plan)
    ratio = base.one_thread_over_all
    if ratio is None or threads == 1 or rank == threads:
        return threads / rank * turns
    serial = min(max((threads / ratio - 1) / (threads - 1), 0.0), 1.0)
    return (serial + (1 - serial) / rank) / (serial + (1 - serial) / threads) * turns


def core_turns(facts: ModelFacts, plan: Plan) -> float:
    """How many ranks' threads take turns on each core of a CPU node: a node's ranks, each on
    ``threads // ranks`` threads (at least one), over the cores the profile could run on (its
    threads where those were not recorded and it ran on several); 1 where they do not
    outnumber the cores, or nothing says how many there are."""
    base = facts.baseline
    if facts.device_type != "cpu" or base is None or not base.threads:
        return 1.0
    cores = base.cores or (base.threads if base.threads > 1 else None)
    if cores is None:
        return 1.0
    busy = plan.nproc_per_node * max(1, base.threads // plan.nproc_per_node)
    return max(1.0, busy / cores)


def steps_on_host(plan: Plan) -> bool:
    """Whether the plan's optimizer steps on the host's CPU: DeepSpeed's ``offload_optimizer``,
    or FSDP2's ``CPUOffloadPolicy`` (its ``offload_param``), which keeps the states there."""
    if plan.engine == "fsdp2":
        return plan.offload_param != "none"
    return plan.offload_optimizer != "none"


def _host_optimizer_seconds(facts: ModelFacts, plan: Plan) -> tuple[float | None, str | None]:
    """An offloaded plan's optimizer step on the host's CPU, from the rate the profile probed;
    ``(None, why)`` where the plan offloads and no rate was probed."""
    if not steps_on_host(plan):
        return None, None
    rate = facts.baseline.host_adam_per_s if facts.baseline else None
    if rate is None:
        return (
            None,
            "the offloaded optimizer's step time needs a profile that probed the host's Adam rate",
        )
    partition = facts.trainable_parameters / plan.world_size
    return cm.host_adam_seconds(partition, plan.nproc_per_node, rate), None


def estimate_plan(
    facts: ModelFacts,
    plan: Plan,
    *,
    reference: Plan | None = None,
    machine: Machine = NO_BUDGET,
) -> PlanEstimate:
    """Predict one plan's per-device memory, fit, seconds per step (where a profile measured
    them), step-time ratio to the reference plan, and communication.

    Args:
        facts: the model, from a profile or a trace.
        plan: the plan to predict.
        reference: the plan step-time ratios are relative to; the measured
            baseline's plan when ``facts`` has one.
        machine: the budget and margin (no budget: ``fits`` unknown) and the links:
            inside a node and between nodes (communication time), host-device (offload).
    """
    peak, temps, how, states, source = predict_peak(facts, plan)
    spec, _ = activation_spec(facts, plan.precision)
    layers, k = facts.num_layers, plan.checkpoint_blocks
    sizes = {
        "parameters": states.parameters,
        "buffers": float(facts.buffers),
        "gradients": states.gradients,
        "optimizer_states": states.optimizer_states,
        "activations": cm.activation_peak(spec.figures(layers), plan.micro_batch, k),
        "autocast_weight_copies": spec.weight_copies(layers, k)
        if plan.precision.startswith("amp")
        else 0.0,
        "temporaries": temps,
    }
    notes = [note for note in (activation_spec(facts, plan.precision)[1],) if note]
    if plan.checkpoint_blocks > facts.num_layers:
        notes.append(
            f"{plan.checkpoint_blocks} blocks checkpointed but the stack has {facts.num_layers}"
        )
    overlap = zero.gloo_overlap_bytes(facts, plan)
    if overlap:
        high, seen = zero.GLOO_OVERLAP
        notes.append(
            f"over gloo (CPU) a rank's peak was one fp32 gradient partition higher "
            f"(+{overlap:,.0f} bytes) in {high} of {seen} measured rank-peaks: gloo can still "
            "hold the all-reduced bucket when the partition is allocated; the peak above is "
            "the other, more frequent mode"
        )
    psi = facts.trainable_parameters
    comm_bytes, comm_s, comm_note = step_communication(
        plan, psi, facts.parameter_sizes, machine,
        blocks=facts.num_layers, block_parameters=facts.block_parameters,
    )  # fmt: skip
    notes.extend(note for note in (comm_note,) if note)
    offload = zero.offload_bytes_per_step(
        parameters=facts.parameters,
        trainable=psi,
        precision=plan.precision,
        world_size=plan.world_size,
        grad_accum=plan.grad_accum,
        offload_optimizer=plan.offload_optimizer != "none",
        offload_param=plan.offload_param != "none",
    )
    offload_s = offload_seconds(offload, machine)
    if comm_bytes and comm_s is None:
        notes.append("communication time not included: no bandwidth given")
    if offload and offload_s is None:
        notes.append("offload transfer time not included: no PCIe bandwidth given")
    elif offload:
        link = ("read by NVML on the profiled GPU" if machine.pcie_source == "nvml"
                else "--pcie-gbps")  # fmt: skip
        notes.append(
            f"offload moves {offload / 2**30:.2f} GiB per step over the host link at "
            f"{machine.pcie_gbps:g} Gbit/s ({link}): {offload_s:.3f} s, not overlapped"
        )
    ref = facts.baseline.plan if facts.baseline else (reference or plan)
    host_step = _host_optimizer_seconds(facts, plan)
    engine_s, engine_note = engine_seconds(
        plan, machine.link, facts.parameter_sizes, facts.num_layers
    )
    ratio, seconds, time_source, time_note = _step_ratio(
        facts, plan, ref, (comm_s or 0.0) + (offload_s or 0.0) + engine_s, host_step
    )
    if engine_note and time_source == "measured":
        notes.append(engine_note)
    if time_source == "measured" and facts.baseline is not None:
        notes.append(f"step time per micro-batch: {facts.baseline.time_fit}")
    share = cpu_core_share(facts, plan)
    if share != 1.0 and time_source == "measured":
        base, scaling = facts.baseline, "linear in threads"
        if base is not None and base.one_thread_over_all is not None:
            scaling = (f"Amdahl's law through the profile's own: one thread took "
                       f"x{base.one_thread_over_all:.2f} the time of its {base.threads}")  # fmt: skip
        turns = core_turns(facts, plan)
        if turns > 1.0:
            scaling += (f"; {plan.nproc_per_node} ranks take turns on the cores, "
                        f"x{turns:.3g}")  # fmt: skip
        notes.append(
            f"on a CPU device the node's {plan.nproc_per_node} ranks share the cores the profile "
            f"ran on: each rank's compute is taken as x{share:.3g} the profile's ({scaling})"
        )
    if host_step[0] is not None and time_source == "measured":
        notes.append(
            f"the optimizer steps on the host's CPU: {host_step[0]:.3f} s per step at the rate "
            "the profile probed (torch's fused Adam on the profiling machine's CPU, which "
            "stands in for the target's)"
        )
    notes.extend(note for note in (time_note,) if note)
    host = host_bytes_per_node(facts, plan)
    host_fits = machine.fits_host(host)
    if host:
        notes.append(
            f"offloaded states take {host / 2**30:.2f} GiB of host RAM per node "
            f"({plan.nproc_per_node} ranks)"
            + ("" if machine.host_memory is None else f" of {machine.host_memory / 2**30:.2f} GiB")
        )
    device_fits = machine.fits(peak)
    fits = False if False in (device_fits, host_fits) else device_fits and host_fits
    usable = machine.usable
    return PlanEstimate(
        plan=plan,
        memory=MemoryEstimate(
            **{name: round(value) for name, value in sizes.items()},
            peak=round(peak),
            peak_composition=how,
        ),
        fits=fits,
        headroom_bytes=None if usable is None else round(usable - peak),
        predicted_step_time_ratio=ratio,
        predicted_step_seconds=seconds,
        predicted_step_seconds_interval=step_seconds_interval(seconds),
        time_source=time_source,
        communication_bytes_per_step=round(comm_bytes),
        communication_seconds=comm_s,
        offload_bytes_per_step=round(offload),
        host_optimizer_seconds=host_step[0],
        host_bytes_per_node=round(host),
        host_fits=host_fits,
        accounting=states.accounting,
        source=source,
        notes=notes,
    )


def offload_seconds(offload_bytes: float, machine: Machine) -> float | None:
    """Seconds the host link takes for a step's offload traffic (``None``: no bandwidth)."""
    return cm.transfer_seconds(offload_bytes, machine.pcie_gbps)


def host_bytes_per_node(facts: ModelFacts, plan: Plan) -> float:
    """Host RAM a plan's offloaded states take on each node (:mod:`._offload`); 0 on a CPU
    device, where offload frees nothing and nothing moves."""
    if facts.device_type == "cpu":
        return 0.0
    return (
        plan.nproc_per_node
        * host_bytes_per_rank(
            parameters=facts.parameters,
            trainable=facts.trainable_parameters,
            precision=plan.precision,
            zero_stage=plan.zero_stage,
            world_size=plan.world_size,
            engine=plan.engine,
            grad_accum=plan.grad_accum,
            largest_parameter=facts.largest_parameter,
            optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
            offload_optimizer=plan.offload_optimizer != "none",
            offload_param=plan.offload_param != "none",
        ).total
    )


def plan_grid(facts: ModelFacts, base: Plan) -> list[Plan]:
    """A sensible grid around ``base`` for its devices: precision x ZeRO stage x
    checkpointed blocks (0, L/2, L) x micro-batch (keeping samples per device per step), and
    on a GPU the offload plans of :data:`OFFLOAD_GRID` over the same blocks and micro-batches.
    """
    per_device = base.micro_batch * base.grad_accum
    micro = sorted({per_device, max(per_device // 2, 1), max(per_device // 4, 1), 1}, reverse=True)
    micro = [mb for mb in micro if per_device % mb == 0]
    layers = facts.num_layers
    ckpts = sorted({0, layers // 2, layers}) if layers else [0]
    stages = [0, 1, 2, 3] if base.world_size > 1 else [0]
    plans = []
    for precision in ("fp32", "amp_bf16", "bf16"):
        for stage in stages:
            for ckpt in ckpts:
                for mb in micro:
                    plans.append(
                        base.with_changes(
                            precision=precision,
                            zero_stage=stage,
                            checkpoint_blocks=ckpt,
                            micro_batch=mb,
                            grad_accum=per_device // mb,
                            offload_optimizer="none",
                            offload_param="none",
                        )
                    )
    if facts.device_type == "cpu":  # offload frees nothing where the host is the device
        return plans
    for stage, offload_param in OFFLOAD_GRID:
        for ckpt in ckpts:
            for mb in micro:
                plans.append(
                    base.with_changes(
                        precision="bf16", zero_stage=stage, checkpoint_blocks=ckpt,
                        micro_batch=mb, grad_accum=per_device // mb, offload_optimizer="cpu",
                        offload_param="cpu" if offload_param else "none",
                    )
                )  # fmt: skip
    return plans


OFFLOAD_GRID = ((2, False), (3, False), (3, True))
"""The offload plans a grid adds (bf16, on a GPU): ZeRO-Offload of the optimizer at stages 2
and 3, and ZeRO-3 with the parameters on the host too."""


def estimate(
    facts: ModelFacts,
    plans: list[Plan],
    *,
    reference: Plan | None = None,
    machine: Machine = NO_BUDGET,
    train_tokens: int | None = None,
    mfu: float | None = None,
    peak_flops: float | None = None,
    claims: Sequence[Claim] = (),
) -> EstimateRecord:
    """Predict every plan in ``plans``; see :func:`estimate_plan` for the per-plan figures.

    Args:
        facts: the model.
        plans: the plans to predict.
        reference: the plan ratios are relative to when nothing was measured
            (default: the first plan).
        machine: the budget, the margin and the links (see :func:`estimate_plan`).
        train_tokens: token budget for the days-to-train figure.
        mfu: assumed model FLOPs utilisation for days to train.
        peak_flops: per-device peak FLOP/s for days to train.
        claims: rows of a table (a plan and the memory, throughput, TFLOPS or MFU it states)
            to check against the model-state floor, the FLOPs per token and the peak.
    """
    reference = facts.baseline.plan if facts.baseline else (reference or plans[0])
    results = []
    for plan in plans:
        result = estimate_plan(
            facts,
            plan,
            reference=reference,
            machine=machine,
        )
        if train_tokens:
            days, how = plan_train_days(
                facts,
                plan,
                result.predicted_step_time_ratio,
                train_tokens,
                mfu=mfu,
                peak_flops=peak_flops,
            )
            result = result.model_copy(update={"train_days": days, "notes": [*result.notes, how]})
        results.append(result)
    return EstimateRecord(
        model=facts.name,
        parameters=facts.parameters,
        trainable_parameters=facts.trainable_parameters,
        num_layers=facts.num_layers,
        seq_len=facts.seq_len,
        device_memory_bytes=machine.device_memory,
        budget_source=machine.budget_source,
        margin=machine.margin,
        intra_gbps=machine.intra_gbps,
        inter_gbps=machine.inter_gbps,
        baseline=reference,
        train_tokens=train_tokens,
        plans=results,
        checks=[check_claim(facts, claim) for claim in claims],
    )
