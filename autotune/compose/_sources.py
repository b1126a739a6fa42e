"""Where a composition's facts come from: a profile of real steps (with the precisions it did not
run traced beside it), or a trace of the model file alone. Runtime is imported inside the
functions, so importing this module imports no torch."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.estimator import ModelFacts, assumed_cublas_workspace
from autotune.records import (
    AUTOCAST_PLAN_PRECISION,
    DEFAULT_MARGIN,
    SHORT_PROFILE_STEPS,
    SHORT_PROFILE_WARMUP,
    TIME_PROFILE_STEPS,
    ActivationRecord,
    AutotuneError,
    Machine,
    ProfileRecord,
)

if TYPE_CHECKING:
    from autotune.runtime.profiler import Profiled

TRACED_PRECISIONS = ("fp32", "amp_bf16", "bf16")
"""The plan precisions a profile carries figures of (measured for its own, traced for the
others): the ones the policy and the search choose between (fp16's match bf16's)."""

SHORT_BATCH = 2
"""The short profile's micro-batch at most; a second one at up to 4x it fits the step time."""
OPERATOR_MARGIN = 8.0
"""How many times a tiny Linear's seconds per operator (``time.seconds_per_op``) one operator of
a model may cost beyond its compute. The parts per micro-batch fitted between micro-batches 2 and
4 on this repo's CPU came to 2.4 times it an operator on tiny Llama (9.8 us against 4.1) and 6.8
times on a 6-layer 12.6M Llama at sequence 512 (37 ms for 1358 operators, against 4.0 us)."""
IMMATERIAL = 0.05
"""The share of the first profile's forward and backward under which its operators' own cost
(:func:`per_call_bound`) leaves nothing for a second micro-batch's timed steps to find: a part
per micro-batch fitted through two points at b and 2b carries about 2.8 times the steps' own
noise (2-3 % here) as a share of the first, so under 5 % it is not resolved."""


def profile_model(
    model_path: str | Path, *, trace: bool = True, second: bool = False, **options: Any
) -> ProfileRecord:
    """:func:`autotune.runtime.profiler.profile` of the model file, with the activation figures
    of every plan precision it did not run traced on fake tensors beside the measured ones
    (``memory.traced``), so every road that later reads the record predicts those plans alike.

    Args:
        trace: trace the other precisions (seconds on fake tensors; nothing allocated).
        second: after the profile, time steps at a second micro-batch where its operators' own
            cost may matter (:func:`second_micro_batch`), kept in the record (``second``): every
            road that reads it then splits each phase's time into a fixed part per micro-batch
            and a part per sample, as tune's own short profiles do.
        **options: the profiler's keyword arguments (batch size, steps, device, ...).
    """
    if not second:
        return _profiled(model_path, trace=trace, **options).profile
    profiled = _timed_again(model_path, second_micro_batch, trace=trace, **options)
    return profiled.profile.model_copy(update={"second": profiled.timed})


def second_micro_batch(first: ProfileRecord) -> int:
    """The micro-batch ``autotune profile`` times its steps at again, after it: a quarter of its
    batch (at least 1, so it fits wherever the profile did), or after a profile of one sample
    up to 4 where the profile predicts that fits (:func:`_largest_fitting_batch`)."""
    batch = first.config.batch_size
    return max(1, batch // 4) if batch > 1 else min(4, _largest_fitting_batch(first))


def _timed_again(
    model_path: str | Path, choose: Callable[[ProfileRecord], int], **options: Any
) -> Profiled:
    """:func:`_profiled` with timed steps at the micro-batch ``choose`` picks after the profile,
    where its operators' own cost may matter (else, as where those steps ran out of memory, a
    note on stderr says why each phase is taken as proportional to the micro-batch)."""

    def second(first: ProfileRecord) -> int:
        skip = _second_skipped(first)
        if skip is None:
            return choose(first)
        print(f"autotune: note: {skip}", file=sys.stderr)
        return first.config.batch_size

    profiled = _profiled(model_path, second_batch=second, second_steps=TIME_PROFILE_STEPS,
                         **options)  # fmt: skip
    if profiled.out_of_memory is not None:
        print(f"autotune: note: the timed steps at micro-batch {profiled.out_of_memory} ran out "
              "of memory; each phase's time is taken as proportional to the micro-batch",
              file=sys.stderr)  # fmt: skip
    return profiled


def _profiled(model_path: str | Path, *, trace: bool = True, **options: Any) -> Profiled:
    """:func:`profile_model`, with what :func:`autotune.runtime.profiler.profile_and_time`
    timed after it (its ``second_batch`` among ``options``)."""
    from autotune.runtime.profiler import profile_and_time

    refuse_oversized(
        model_path, options.get("device", "auto"), str(options.get("label") or model_path)
    )
    profiled = profile_and_time(model_path, **options)
    if not trace:
        return profiled
    report = options.get("progress") or (lambda phase, done, total: None)
    report("trace", 0, 1)  # the other precisions, on fake tensors
    record = with_traced(profiled.profile, model_path)
    report("trace", 1, 1)
    return replace(profiled, profile=record)


def refuse_oversized(model_path: str | Path, device: str, name: str) -> None:
    """Refuse, in one line and before any real step, a model whose states (16 bytes a parameter:
    fp32 weights, gradients, Adam's moments) cannot fit where it would be profiled.

    Raises:
        AutotuneError: naming ``name``, the size, the room and the road that needs no real step.
    """
    from autotune.runtime.trace import (
        STATE_BYTES_PER_PARAMETER,
        real_step_parameters,
        real_step_room,
    )

    parameters = real_step_parameters(model_path)
    room, where = real_step_room(device_type(device), device)
    if parameters is None or room is None:
        return
    states = STATE_BYTES_PER_PARAMETER * parameters
    if states > room:
        raise AutotuneError(
            f"{name}: a profile runs real steps, and {parameters / 1e9:.2f}B parameters take "
            f"{states / 2**30:.1f} GiB of weights, gradients and Adam states, over the "
            f"{room / 2**30:.1f} GiB of {where}; estimate it from the model alone (`autotune "
            "estimate --hf-config` or a model file: traced, nothing run), or profile it on a "
            "machine that fits it"
        )


def with_traced(record: ProfileRecord, model_path: str | Path) -> ProfileRecord:
    """``record`` with the figures of the precisions it lacks traced from ``model_path`` (kept
    as they are where no trace path can run: the estimate then derives them by formula, and
    its note says so)."""
    measured = AUTOCAST_PLAN_PRECISION[record.config.precision]
    wanted = tuple(p for p in TRACED_PRECISIONS if p != measured and p not in record.memory.traced)
    if not wanted:
        return record
    from autotune.runtime.trace import traced_activations

    try:
        specs = traced_activations(model_path, wanted)
    except AutotuneError:  # the trace's limit; the profile itself ran
        return record
    traced = {**record.memory.traced,
              **{k: ActivationRecord.model_validate(v.model_dump()) for k, v in specs.items()}}  # fmt: skip
    return record.model_copy(update={"memory": record.memory.model_copy(update={"traced": traced})})


def short_profiles(model_path: str | Path, per_rank: int, device: str) -> ProfileRecord:
    """A short profile of a model file at micro-batch ``min(2, per_rank)`` (traced beside,
    :func:`profile_model`) carrying, as ``second``, its timed steps alone at up to 4x that, in
    the same process after it, where the per-rank batch is larger, the first predicts that it
    fits a GPU and its operators can matter (:func:`per_call_bound`; ``None`` otherwise, or
    where it ran out of memory all the same: a note on stderr says so), so the step-time model
    splits each phase into a fixed part per micro-batch and a part per sample, which is what
    ranks micro-batches of one global batch. The record has the form ``autotune profile``
    writes: every road that reads it fits the second alike. The second measures no memory or
    FLOPs: the first has them."""

    def second(first: ProfileRecord) -> int:
        return max(first.config.batch_size,
                   min(per_rank, 4 * first.config.batch_size, _largest_fitting_batch(first)))  # fmt: skip

    profiled = _timed_again(model_path, second, batch_size=min(SHORT_BATCH, per_rank),
                            steps=SHORT_PROFILE_STEPS, warmup=SHORT_PROFILE_WARMUP,
                            device=device)  # fmt: skip
    return profiled.profile.model_copy(update={"second": profiled.timed})


def per_call_bound(record: ProfileRecord) -> float | None:
    """The most seconds a micro-batch's forward and backward can spend beyond its samples' work:
    its operators (``time.ops_per_micro_batch``) at :data:`OPERATOR_MARGIN` times the device's
    measured seconds per operator; ``None`` where either was not measured."""
    time = record.time
    if time.ops_per_micro_batch is None or time.seconds_per_op is None:
        return None
    return OPERATOR_MARGIN * time.ops_per_micro_batch * time.seconds_per_op


def _second_skipped(first: ProfileRecord) -> str | None:
    """Why no second micro-batch is timed (``None``: it is): the per-call bound is under
    :data:`IMMATERIAL` of the first profile's forward and backward, so the fit would split
    noise, not overhead. GPT-2 small at micro-batch 2 on this repo's CPU: 2103 operators bound
    it to 71 ms of 3.4 s, where a fit to micro-batch 4 had found a fixed 1.9 s of 7.1 s; its 32
    measured plans, predicted from the first profile alone, came 8.2 % off at the median,
    against 15.2 % with the fit (in-sample: seen before this was written)."""
    bound, time = per_call_bound(first), first.time
    compute = time.forward + time.backward
    if bound is None or compute <= 0 or bound > IMMATERIAL * compute:
        return None
    return (f"no timed steps at a second micro-batch: the {time.ops_per_micro_batch} operators "
            f"of a forward and backward cost at most {bound * 1e3:.0f} ms beyond their samples' "
            f"work, {bound / compute:.1%} of the {compute:.2f} s measured at micro-batch "
            f"{first.config.batch_size}; each phase's time is taken as proportional to the "
            "micro-batch")  # fmt: skip


def _largest_fitting_batch(first: ProfileRecord) -> int:
    """The largest micro-batch whose fp32 step the first profile predicts to fit its GPU's
    memory less the default margin: its peak plus the activations of each sample more (no bound
    on a CPU, where the host's memory is the device's)."""
    total, memory = first.environment.device_memory_bytes, first.memory
    if first.config.device != "cuda" or not total:
        return sys.maxsize
    fit = memory.activation_fit
    per_sample = fit.per_sample if fit else memory.activations / first.config.batch_size
    room = total * (1 - DEFAULT_MARGIN) - memory.peak
    return (
        first.config.batch_size + max(0, int(room // per_sample)) if per_sample > 0 else sys.maxsize
    )


def profiled_model(record: ProfileRecord) -> Path | None:
    """The model file a profile ran, where it is still there and unchanged (its sha256)."""
    import hashlib

    provenance = record.provenance
    path = Path(provenance.model_file)
    try:
        same = hashlib.sha256(path.read_bytes()).hexdigest() == provenance.model_sha256
    except OSError:
        return None
    return path if same else None


def completed(record: ProfileRecord, model_path: str | Path | None = None) -> ProfileRecord:
    """A saved profile with the precisions it lacks traced from its model file (``model_path``,
    else the file it names, where unchanged): an older record, or one of a script."""
    path = model_path or profiled_model(record)
    return record if path is None else with_traced(record, path)


def model_file_facts(
    model_path: str | Path, precisions: tuple[str, ...], device: str = "auto", batch: int = 1
) -> ModelFacts:
    """The model-file road: every static fact a profile records (parameter sizes in order, tied
    parameters, the optimizer's step path, the block stack) and a whole step traced on fake
    tensors, for plans running on ``device`` (``auto``: a GPU if this machine has one) from the
    micro-batch ``batch`` a profile would run (where a CPU's oneDNN scratch is read)."""
    from autotune.runtime.trace import facts_from_model_file

    kind = device_type(device)
    workspace = device_workspace(kind, device)  # a bad CUBLAS_WORKSPACE_CONFIG before the trace
    scratch = batch if kind == "cpu" else None
    facts = facts_from_model_file(model_path, precisions=precisions, cpu_scratch=scratch)
    return facts.model_copy(update={"device_type": kind, **workspace})


def hf_config_facts(
    config: str | Path, seq_len: int, precisions: tuple[str, ...], task: str | None,
    device: str = "auto",
) -> tuple[ModelFacts, bool]:  # fmt: skip
    """The model-file road for a transformers config (cached by its bytes); whether it was a
    cache hit."""
    from autotune.runtime.trace_cache import facts_from_hf_config_cached

    kind = device_type(device)
    workspace = device_workspace(kind, device)
    facts, hit = facts_from_hf_config_cached(config, seq_len, precisions, task)
    return facts.model_copy(update={"device_type": kind, **workspace}), hit


def device_workspace(kind: str, device: str) -> dict[str, object]:
    """The traced facts' update for plans on a GPU: cuBLAS's workspace, which no trace
    allocates and every real step's allocator peak holds. Measured where this machine has
    NVIDIA's driver (:func:`autotune.runtime.trace.device_workspace`, which imports torch), else
    assumed from torch's defaults without importing it; nothing for a CPU.

    Raises:
        AutotuneError: a ``CUBLAS_WORKSPACE_CONFIG`` that is not ``:KiB:COUNT`` pairs.
    """
    if kind != "cuda":
        return {}
    if _nvidia_driver():
        from autotune.runtime.trace import device_workspace as measured

        held, source = measured(device)
    else:
        held, source = assumed_cublas_workspace(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    return {"device_workspace": held, "device_workspace_source": source}


def default_budget(machine: Machine, device: str = "auto") -> Machine:
    """``machine`` with the default device's budget where none was given, for a road with no
    profile: the GPU's memory where plans run on one this machine has, this machine's available
    memory where they run on its CPU; unchanged (no budget) for a GPU this machine lacks."""
    kind, gpu = device_type(device), None
    if machine.device_memory is None and kind == "cuda":
        from autotune.runtime.trace import device_memory

        gpu = device_memory(device)
    return machine.with_budget_for(kind, gpu)


def device_type(device: str) -> str:
    """The device type plans run on (``cpu`` or ``cuda``) for a checked ``--device``, without
    importing torch (a cached trace answers with torch blocked): ``auto`` is a GPU where this
    machine has NVIDIA's driver (``/dev/nvidiactl``), as ``torch.cuda`` would find it; ``cuda``
    need not be here (a plan for a GPU elsewhere)."""
    if device == "auto":
        return "cuda" if _nvidia_driver() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def _nvidia_driver() -> bool:
    """Whether this machine has NVIDIA's driver (``/dev/nvidiactl``), read without torch."""
    return os.path.exists("/dev/nvidiactl")
