"""ZeRO memory accounting: model states per device, gradient buckets, communication and offload.

The one home of these formulas (METHOD.md section 2): the estimator, the peak model,
the DeepSpeed emitter and the claim check all call them. Pure arithmetic, no torch.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

from autotune.estimator._costmodel import ADAM_STATE_BYTES, WEIGHT_BYTES, Accounting
from autotune.estimator._modelfacts import ModelFacts
from autotune.records import AutotuneError, Plan

PAPER_K = 12
"""The ZeRO paper's optimizer multiplier for mixed precision: fp32 master + m + v."""

# DeepSpeed's own default, written out so configs show what the engine will use.
BUCKET_SIZE = 500_000_000
BUCKET_ALIGNMENT = 2
"""ZeRO-1/2 asserts allgather_bucket_size % 2 == 0 (4-byte NCCL alignment of 16-bit elements)."""
STAGE3_PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold`` the emitted configs write (DeepSpeed's default): a
parameter of at most this many elements stays gathered on every rank once fetched."""


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
    partition at the optimizer step. For 16-bit weights this gives stage 1
    (2 + 2 + 16/N) and stage 2 (2 + 18/N), DeepSpeed's own estimators' figures.
    Stage 3 is :func:`zero3_bytes`, the one ZeRO-3 accounting (parts and moments).

    Args:
        parameters: all parameters (frozen ones are held too).
        trainable: parameters with gradients; gradients and optimizer states follow them.
        precision: a plan precision (fp32, amp_bf16, amp_fp16, bf16, fp16).
        zero_stage: DeepSpeed ZeRO stage 0-3.
        world_size: data-parallel devices N.
        largest_layer: parameter count of the largest single module (unused since stage 3
            is :func:`zero3_bytes`, which gathers every parameter; kept for callers).
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
        return zero3_bytes(
            parameters=parameters, trainable=trainable, precision=precision,
            world_size=n, optimizer_bytes_per_param=optimizer_bytes_per_param,
            offload_optimizer=offload_optimizer, offload_param=offload_param,
        )[1]  # fmt: skip
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


def bucket_elements(parameters: int | None) -> int:
    """Elements per ZeRO gradient bucket (``reduce_bucket_size`` / ``allgather_bucket_size``).

    ZeRO allocates its gradient buckets at full size whatever the model (stage 1/2:
    two of them with overlap_comm), so DeepSpeed's 500M default costs a model of a few
    thousand parameters 4 GB in fp32. A bucket holding every parameter already reduces
    them all in one collective, which is what the default does for any model under
    500M parameters, so capping the bucket at the model's size frees that memory and
    keeps DeepSpeed's communication schedule unchanged.

    Args:
        parameters: the model's parameter count; None (unknown) keeps DeepSpeed's default.

    Returns:
        ``min(BUCKET_SIZE, parameters)`` rounded up to a multiple of ``BUCKET_ALIGNMENT``
        (at least ``BUCKET_ALIGNMENT``).

    Example:
        >>> bucket_elements(2145), bucket_elements(7_000_000_000), bucket_elements(None)
        (2146, 500000000, 500000000)
    """
    if parameters is None:
        return BUCKET_SIZE
    if parameters < 0:
        raise AutotuneError(f"parameters: {parameters} must not be negative")
    size = max(parameters, BUCKET_ALIGNMENT)
    size += -size % BUCKET_ALIGNMENT
    return min(BUCKET_SIZE, size)


def states_for(facts: ModelFacts, plan: Plan) -> StateBytes:
    """Model-state bytes per device for a plan (the implementation's accounting).

    On a CPU device the "offloaded" states stay in the same memory: offload frees nothing.
    An ``engine=fsdp2`` plan takes FSDP2's accounting: ``_fsdp.plan_states``.
    """
    if plan.engine != "deepspeed":
        raise AutotuneError(f"states_for: {plan.describe()}: use plan_states for FSDP2 plans")
    host_is_device = facts.device_type == "cpu"
    return model_state_bytes(
        parameters=facts.parameters,
        trainable=facts.trainable_parameters,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        world_size=plan.world_size,
        largest_layer=facts.largest_layer_parameters,
        optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
        offload_optimizer=plan.offload_optimizer != "none" and not host_is_device,
        offload_param=plan.offload_param != "none" and not host_is_device,
    )


def bucket_bytes(facts: ModelFacts, plan: Plan) -> float:
    """ZeRO's gradient buckets, sized as the emitted config sizes them (:func:`bucket_elements`)."""
    return zero_bucket_bytes(
        zero_stage=plan.zero_stage if plan.engine == "deepspeed" else 0,
        bucket_elements=bucket_elements(facts.parameters),
        precision=plan.precision,
    )


STAGE3_MAX_LIVE_PARAMETERS = 1e9
"""DeepSpeed's default ``stage3_max_live_parameters``: the most parameters gathered at once."""

ZeroMoments = dict[str, dict[str, float]]
"""moment (backward, reduce, optimizer) -> bytes of parameters, gradients, optimizer_states,
temporaries held by a ZeRO engine at that moment, per rank."""


def zero3_bytes(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    world_size: int,
    bucket_elements: float = 0.0,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    offload_optimizer: bool = False,
    offload_param: bool = False,
    embedding_parameters: float = 0.0,
    gloo: bool = False,
    persistent_parameters: float = 0.0,
) -> tuple[ZeroMoments, StateBytes]:
    """DeepSpeed ZeRO-3 per rank, the one accounting: what it holds at each moment the step
    can peak, and the parts reported beside the peak, each the largest over those moments.

    What is held when (deepspeed 0.19, s3 = ``stage3.py``, ppc =
    ``partitioned_param_coordinator.py``; checked per rank against torch's memory profiler
    in ``bench/zero_peaks.py``):

    - throughout: the 16-bit (or fp32) parameter partition P = trainable / N, a gradient
      partition buffer of P in the same dtype (s3:791), one bucket (s3:782), and an fp32
      master copy of the partition plus the optimizer's moments on it; the master is a
      clone even in fp32 training (the alias branch, s3:1162, compares a ``torch.device``
      with a device-name string, never equal, so s3:1172 clones);
    - from forward to the end of backward, every gathered parameter: with
      ``stage3_max_reuse_distance`` at its default none is released before its backward
      (ppc:652), so the whole model's parameters are gathered at once, up to
      ``stage3_max_live_parameters`` (its default, which the emitted config keeps);
    - at the reduction (the end of backward), the gathered parameters are gone but the
      input embedding's (``embedding_parameters``: its backward is the last, and its
      gradient's hook reduces the bucket before the module releases them), and the bucket
      is flattened (``cat``) for the reduce-scatter, which gloo (``gloo``: a CPU device)
      copies once more (``c10d::_reduce_scatter_base_`` clones its input; NCCL does not):
      a GPT-2 small rank's peak at every checkpointing;
    - outside the backward (where every parameter is gathered), the persistent ones
      (``persistent_parameters``: those of at most :data:`STAGE3_PERSISTENCE_THRESHOLD`
      elements, whole on every rank once fetched; on a tiny Llama every weight but the
      embeddings, at 124M only biases and norms);
    - at the optimizer step, the fp32 gradient partition (4P) and Adam's two temporaries
      of the flat partition.

    Offload (on a GPU): ``offload_param`` keeps the partition on the host (the gathered
    parameters still come to the device), ``offload_optimizer`` the master, the moments
    and the fp32 gradient partition.

    Returns:
        The moments (backward, reduce, optimizer) and the reported parts.
    """
    n = max(world_size, 1)
    w = WEIGHT_BYTES[precision]
    part = trainable / n
    host_optimizer = 0.0 if offload_optimizer else 1.0
    base = {
        "parameters": 0.0 if offload_param else w * part,
        "optimizer_states": host_optimizer * (4.0 + optimizer_bytes_per_param) * part,
        # With the optimizer offloaded, gradients stream to the host (only a bucket stays).
        "gradients": 0.0 if offload_optimizer else w * part,
    }
    bucket = w * bucket_elements
    gathered = w * min(parameters, STAGE3_MAX_LIVE_PARAMETERS)
    flatten = w * min(bucket_elements, trainable) if n > 1 else 0.0
    fp32_gradients = host_optimizer * 4.0 * part
    persistent = w * min(persistent_parameters, parameters)
    moments = {
        "backward": {**base, "parameters": base["parameters"] + gathered, "temporaries": bucket},
        "reduce": {
            **base,
            "parameters": base["parameters"]
            + persistent
            + w * min(embedding_parameters, parameters),
            "temporaries": bucket + flatten * (2 if gloo else 1),
        },
        "optimizer": {
            **base,
            "parameters": base["parameters"] + persistent,
            "gradients": base["gradients"] + fp32_gradients,
            "temporaries": bucket + 2 * fp32_gradients,
        },
    }
    parts = {name: max(moment[name] for moment in moments.values())
             for name in ("parameters", "gradients", "optimizer_states")}  # fmt: skip
    states = StateBytes(
        parameters=parts["parameters"],
        gradients=parts["gradients"],
        optimizer_states=parts["optimizer_states"],
        accounting="deepspeed",
        step_gradients=fp32_gradients,
    )
    return moments, states


def zero_engine_bytes(
    *,
    parameters: float,
    trainable: float,
    precision: str,
    zero_stage: int,
    world_size: int,
    bucket_elements: float,
    grad_accum: int = 1,
    largest_parameter: float = 0.0,
    optimizer_bytes_per_param: float = ADAM_STATE_BYTES,
    partition_extent: float | None = None,
    embedding_parameters: float = 0.0,
    gloo: bool = False,
    tied_parameters: float = 0.0,
    persistent_parameters: float = 0.0,
) -> ZeroMoments:
    """What a DeepSpeed ZeRO 1-3 engine allocates per rank, at each moment the step can peak.

    Read from deepspeed 0.19's ``stage_1_and_2.py`` (s12), ``stage3.py`` (s3),
    ``partitioned_param_coordinator.py`` and torch's ``adam.py``, for the configs the
    emitter writes (``overlap_comm``, ``contiguous_gradients``, buckets of
    ``bucket_elements``, a torch client optimizer), and checked per rank against
    torch's memory profiler (``bench/zero_peaks.py``):

    - stages 1-2 hold the flat 16-bit (or fp32) weights (s12:505), an fp32 master
      partition even in fp32 training (s12:560) and the optimizer's moments on it;
      two gradient buckets from a backward's first gradient to its end (s12:3266,
      3275), every ``.grad`` a view into the first; at the end of a backward the
      whole bucket is flattened once more for the all-reduce (s12:2367);
    - under accumulation stage 2 keeps the gradient partition of the earlier
      micro-batches (s12:1039) and stage 1 the full ``.grad`` (no reduction off the
      boundary, s12:2293);
    - at the optimizer step the fp32 gradient partition (s12:3118) and Adam's two
      temporaries of the flat partition (adam.py's single-tensor path) are live;
    - stage 3 holds its partitions, a gradient partition buffer from the start
      (s3:791) and one bucket (s3:782); its fp32 master is a copy of the partition
      even in fp32 training: the alias branch (s3:1162) compares the partition's
      ``torch.device`` with the accelerator's device *name*, a string, which torch
      never finds equal, so the partition is cloned (s3:1172); with
      ``stage3_max_reuse_distance`` at its default
      every gathered parameter stays gathered from forward to backward (ppc:652).

    The partition ``P`` is ``trainable / N``; a partition boundary may cut a parameter,
    which then counts whole: ``partition_extent`` (:func:`partition_elements`) where the
    parameters' order is known, else ``largest_parameter`` bounds it.
    """
    n = max(world_size, 1)
    w = WEIGHT_BYTES[precision]
    part = trainable / n
    # s12:2186-2192: a parameter cut by the partition's edge counts whole (one edge per rank)
    boundary = partition_extent or min(trainable, part + largest_parameter)
    flatten = w * min(bucket_elements, trainable) if n > 1 else 0.0
    step = {"gradients": 4.0 * part, "temporaries": 2 * 4.0 * part}
    if zero_stage >= 3:
        return zero3_bytes(parameters=parameters, trainable=trainable, precision=precision,
                           world_size=n, bucket_elements=bucket_elements,
                           optimizer_bytes_per_param=optimizer_bytes_per_param,
                           embedding_parameters=embedding_parameters, gloo=gloo,
                           persistent_parameters=persistent_parameters)[0]  # fmt: skip
    base = {
        "parameters": w * parameters,
        "optimizer_states": (4.0 + optimizer_bytes_per_param) * part,
    }
    buckets = zero_bucket_bytes(
        zero_stage=zero_stage, bucket_elements=bucket_elements, precision=precision
    )
    # The reduction at the end of backward flattens the bucket (s12:2367); the gradient
    # partition it reduces into (s12:2192) comes after that copy is freed, unless the
    # bucket is smaller than the model; stage 1 keeps its full .grad under accumulation.
    if zero_stage == 1:
        earlier = w * trainable if grad_accum > 1 else 0.0
        partition = 0.0
    else:
        earlier = w * boundary if grad_accum > 1 else 0.0
        partition = w * boundary
    small_bucket = bucket_elements < trainable
    reduction = max(flatten + (partition if small_bucket else 0.0), partition, earlier)
    # a parameter several modules share (a head tied to the embedding) gets its gradient at its
    # last use, the embedding's backward, as the sum of the head's and the embedding's: three
    # of its size at once beside the buckets, before the reduction (a 2-block GPT-2 with a 50k
    # vocabulary: its ZeRO-2 rank's peak)
    reduction = max(reduction, 3 * w * tied_parameters)
    # the first gradient autograd makes, before the engine's hook copies it into the bucket
    # and frees it (s12:1455-1460), with every other activation still saved: at worst the
    # largest parameter's (GPT-2's tied head, first in its backward)
    first = w * largest_parameter
    return {
        "backward": {**base, "gradients": earlier, "temporaries": buckets + first},
        # stage 1's accumulated .grad are still there when the boundary's bucket is flattened
        # (GPT-2 small, all blocks checkpointed, accumulation 4: -7.9 % without them)
        "reduce": {**base, "gradients": earlier, "temporaries": buckets + reduction},
        "optimizer": {**base, **step},
    }


@functools.lru_cache(maxsize=256)
def partition_elements(sizes: tuple[int, ...], world_size: int) -> int:
    """The most elements any rank's ZeRO-1/2 gradient partition holds: DeepSpeed sizes it as
    every parameter the rank's slice of the flat buffer touches, whole (s12:2186-2192), so a
    parameter cut by a slice's edge counts in both ranks (GPT-2 small on 2 ranks: the cut falls
    in a block, 0.5M elements over the half, not the 38.6M of its largest, the embedding)."""
    ends = list(itertools.accumulate(sizes))
    total = ends[-1] if ends else 0
    n = max(world_size, 1)
    part = -(-total // (2 * n)) * 2  # the flat buffer padded to 2N elements (s12:387, 505)
    most = 0
    for rank in range(n):
        low, high = rank * part, min((rank + 1) * part, total)
        if low >= high:
            break
        first = bisect.bisect_right(ends, low)  # the parameter holding element ``low``
        last = bisect.bisect_left(ends, high)  # the one holding element ``high - 1``
        most = max(most, ends[last] - (ends[first - 1] if first else 0))
    return most


def engine_moments(facts: ModelFacts, plan: Plan) -> ZeroMoments | None:
    """:func:`zero_engine_bytes` for a plan, or ``None`` where it does not apply.

    It applies to DeepSpeed ZeRO stages 1-3 without an offload that frees device memory.
    """
    offloads = plan.offload_optimizer != "none" or plan.offload_param != "none"
    if (
        plan.engine != "deepspeed"
        or plan.zero_stage < 1
        or (offloads and facts.device_type != "cpu")
    ):
        return None
    return zero_engine_bytes(
        parameters=facts.parameters,
        trainable=facts.trainable_parameters,
        precision=plan.precision,
        zero_stage=plan.zero_stage,
        world_size=plan.world_size,
        bucket_elements=bucket_elements(facts.parameters),
        grad_accum=plan.grad_accum,
        largest_parameter=facts.largest_parameter,
        optimizer_bytes_per_param=facts.optimizer_bytes_per_param,
        partition_extent=(
            partition_elements(facts.parameter_sizes, plan.world_size)
            if facts.parameter_sizes
            else None
        ),
        embedding_parameters=facts.embedding_parameters,
        gloo=facts.device_type == "cpu",
        tied_parameters=facts.largest_tied_parameters,
        persistent_parameters=sum(
            size for size in facts.parameter_sizes or () if size <= STAGE3_PERSISTENCE_THRESHOLD
        ),
    )


def late_temporaries(facts: ModelFacts, plan: Plan) -> float:
    """Of a ZeRO 1-2 engine's backward temporaries, the bytes made at its first gradient.

    The buckets are allocated when the first parameter's gradient arrives (which autograd
    makes before the engine copies it in), after the loss's own backward buffers are freed,
    so the two never coexist; except under stage 1 with accumulation, whose buckets stay
    from the first micro-batch to the boundary (no reduction off the boundary, s12:2293).
    """
    engine = engine_moments(facts, plan)
    if engine is None or plan.zero_stage >= 3:
        return 0.0
    made = engine["backward"]["temporaries"]
    if plan.zero_stage == 1 and plan.grad_accum > 1:
        return made - bucket_bytes(facts, plan)
    return made


GLOO_OVERLAP = (9, 30)
"""Rank-peaks one fp32 gradient partition above the low mode, of those measured: 3 of 10 run
alone and 6 of 20 beside another trial (bench/zero_peak_spread.py, RESULTS.md)."""


def gloo_overlap_bytes(facts: ModelFacts, plan: Plan) -> float:
    """The high mode of a ZeRO-1/2 rank's peak over gloo (CPU), above what is predicted.

    gloo's all_reduce keeps the flattened bucket alive in its work object past the call
    until its worker thread releases it (bench/gloo_hold.py), so in some steps it is still
    held when DeepSpeed allocates the fp32 gradient partition (s12:2192): the peak is then
    one partition, 4 x trainable / N bytes, higher. The estimate predicts the low mode and
    states this one beside it; 0 where it cannot happen (NCCL, one rank, stage 0 or 3).
    """
    if engine_moments(facts, plan) is None or facts.device_type != "cpu":
        return 0.0
    if plan.zero_stage not in (1, 2) or plan.world_size < 2:
        return 0.0
    return 4.0 * facts.trainable_parameters / plan.world_size
