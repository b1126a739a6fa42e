"""Activation figures traced without allocating: FakeTensorMode forwards of a model file or HF config.

Parameters are counted on the meta device; saved-for-backward bytes are counted
with the profiler's own counter (``memory.count_saved_tensors``) during forwards
on fake tensors, at two batch sizes and with no / all blocks checkpointed, so the
fixed, per-sample, per-block and checkpointed-input parts come out exactly as a
real forward would save them.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import _meta_registrations as meta_registrations
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree

from autotune.estimator import ActivationSpec, ModelFacts, TracedMoment, assumed_cublas_workspace
from autotune.records import AutotuneError, Plan
from autotune.runtime import _blocks as blocks
from autotune.runtime import _memory as mem
from autotune.runtime import hf
from autotune.runtime._blocks import apply_checkpointing, find_block_stack, unique_parameter_count
from autotune.runtime._step import AUTOCAST, TrainRunner
from autotune.runtime.modelfile import ModelFile, load_model_file
from autotune.runtime.profiler import TrackedStep, _model_info, tracked_step

DEFAULT_PRECISIONS = ("fp32", "amp_bf16", "bf16")
_AUTOCAST = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}
_WEIGHTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
Forward = Callable[[nn.Module, Any], Any]
"""Runs the model on a batch and returns the loss (only the forward is traced)."""


@contextlib.contextmanager
def _fake_tracing() -> Iterator[FakeTensorMode]:
    """A FakeTensorMode in which the saved-tensor counter and HF masks behave as on real tensors.

    Fake tensors all report data pointer 0; storages are told apart by their
    implementation handle (``memory.storage_key``) and parameters by identity, which
    ``module.parameters()`` already de-duplicates. transformers cannot read fake position ids,
    so it assumes packed sequences and builds a full attention mask a real
    forward skips; the trace's batches are never packed, so that check says so.
    """
    _notes.clear()
    patches: list[tuple[Any, str, Any]] = [
        (
            blocks,
            "unique_parameter_count",
            lambda module: sum(p.numel() for p in module.parameters()),
        ),
    ]
    try:
        import transformers.masking_utils as masking

        patches.append((masking, "find_packed_sequence_indices", lambda position_ids: None))
    except ImportError:
        pass
    # a fake kernel that refuses logs its traceback at ERROR level: the trace falls back instead
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    patches.append((quiet, "disabled", True))
    common = getattr(meta_registrations, "_meta_grouped_mm_common", None)
    if common is not None:
        patches.append((meta_registrations, "_meta_grouped_mm_common", _grouped_mm_as_cpu(common)))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor")
            yield mode
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


GROUPED_MM_NOTE = "_grouped_mm on fp32/fp16 shaped as the CPU kernel runs it"
_notes: list[str] = []
"""What the current trace assumed beyond the fake kernels (each said in the figure's path)."""


def _grouped_mm_as_cpu(common: Callable[..., Any]) -> Callable[..., Any]:
    """torch's fake ``_grouped_mm`` checks CUDA's rule (bf16 inputs only); the CPU kernel a real
    step runs (transformers' MoE experts) takes any float dtype and returns that dtype. Under
    the trace it is shaped as the CPU kernel gives it."""

    def shaped(mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, *args: Any, **kw: Any) -> Any:
        dtype = mat_a.dtype
        if scale_a is None and dtype == mat_b.dtype and dtype in (torch.float32, torch.float16):
            if GROUPED_MM_NOTE not in _notes:
                _notes.append(GROUPED_MM_NOTE)
            half = (mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16))
            return common(*half, scale_a, scale_b, *args, **kw).to(dtype)
        return common(mat_a, mat_b, scale_a, scale_b, *args, **kw)

    return shaped


def _count(
    model: nn.Module, batch: Any, forward: Forward, precision: str, blocks: int
) -> mem.SavedTensors:
    """Saved-for-backward bytes of one forward with ``blocks`` blocks checkpointed."""
    apply_checkpointing(model, blocks)
    dtype = _AUTOCAST.get(precision)
    autocast = torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()
    with autocast, mem.count_saved_tensors(model) as saved:
        loss = forward(model, batch)
    del loss
    return saved


def _step_temporaries(model: nn.Module, batch: Any, forward: Forward) -> int:
    """Temporaries at the peak of one forward and backward, tracked as the profile tracks its step:
    at the start of backward, the loss's gradient buffers (in the loss's dtype)."""
    tracker = mem.LiveTensorTracker(torch.device("cpu"))
    with tracker:
        tracker.mark(model.parameters(), "parameters")
        tracker.mark_batch(batch)
        with mem.count_saved_tensors(model) as saved:
            loss = forward(model, batch)
        for category, keys in saved.keys.items():
            tracker.mark_keys(keys, category)
        loss.backward()
        del loss
        tracker.mark((p.grad for p in model.parameters() if p.grad is not None), "gradients")
    model.zero_grad(set_to_none=True)
    return tracker.at_peak().temporaries


def _temporaries_vs_fp32(
    model: nn.Module, build: Callable[[], nn.Module], batch: Any, forward: Forward, weights: Any
) -> float | None:
    """A 16-bit-weight model's step temporaries over the same step's in fp32 (None: not traced).

    A backward the fake kernels cannot run leaves it untraced rather than failing the whole
    trace: the estimate then keeps fp32's temporaries, which 16-bit ones do not exceed.
    """
    apply_checkpointing(model, 0)
    try:
        low = _step_temporaries(model, _as_dtype(batch, weights), forward)
        torch.manual_seed(0)
        high = _step_temporaries(build().train(), batch, forward)
    except Exception:  # the trace's limit, not the user's mistake (see the docstring)
        return None
    return low / high if high else None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _as_dtype(batch: Any, dtype: torch.dtype) -> Any:
    """Floating-point inputs in the weights' dtype, as a 16-bit-weight engine feeds them."""
    return _pytree.tree_map_only(
        torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, batch
    )


def trace_activations(
    build: Callable[[], nn.Module],
    batch_of: Callable[[int], Any],
    forward: Forward,
    *,
    precision: str,
    layers: int | None = None,
    batch_sizes: tuple[int, int] = (1, 2),
) -> ActivationSpec:
    """Activation figures of one precision from four fake forwards (2 batch sizes x 0 / L checkpointed).

    Args:
        build: builds the model; called under the tracing FakeTensorMode.
        batch_of: fake batch of a given size.
        forward: runs the model on a batch, returning the loss.
        precision: a plan precision (fp32, amp_bf16, amp_fp16, bf16, fp16).
        layers: the real model's L when ``build`` gives a shortened copy (identical
            blocks: the figures are scaled to L blocks); default: the model's own.
        batch_sizes: the two batch sizes of the linear fit.
    """
    weights = _WEIGHTS.get(precision, torch.float32)
    torch.manual_seed(0)
    with _default_dtype(weights):
        model = build()
    model.train()
    found = find_block_stack(model)
    traced = len(found[1]) if found else 0
    real = layers or traced
    points = []
    for b in batch_sizes:
        batch = _as_dtype(batch_of(b), weights) if precision in _WEIGHTS else batch_of(b)
        plain = _count(model, batch, forward, precision, 0)
        block = (mem.block_bytes(plain) or 0) if traced else 0
        outside = plain.activations - traced * block
        kept = _count(model, batch, forward, precision, traced) if traced else plain
        # the first block's input, the reading a profile takes (a CNN's stages shrink theirs)
        block_input = (
            float(kept.block_input) if kept.block_input is not None
            else (kept.activations - outside) / traced if traced else 0.0
        )  # fmt: skip
        # a checkpointed block saves no weight copies: they are made again in its recompute
        copies = plain.autocast_weight_copies
        block_copies = (copies - kept.autocast_weight_copies) / traced if traced else 0.0
        points.append((b, outside + real * block, block, block_input, copies, block_copies))
    (b1, total1, blk1, in1, copies, block_copies), (b2, total2, blk2, in2, _, _) = points
    ratio = (
        _temporaries_vs_fp32(model, build, batch_of(b2), forward, weights)
        if precision in _WEIGHTS
        else None
    )
    span = b2 - b1
    per_sample, block_ps, input_ps = (
        (total2 - total1) / span,
        (blk2 - blk1) / span,
        (in2 - in1) / span,
    )
    return ActivationSpec(
        fixed=total1 - per_sample * b1,
        per_sample=per_sample,
        block_fixed=blk1 - block_ps * b1,
        block_per_sample=block_ps,
        block_input_fixed=in1 - input_ps * b1,
        block_input_per_sample=input_ps,
        autocast_weight_copies=copies + (real - traced) * block_copies,
        block_autocast_weight_copies=block_copies,
        source="traced",
        temporaries_vs_fp32=ratio,
    )


def _facts(
    name: str,
    meta: nn.Module,
    seq_len: int | None,
    activations: dict[str, ActivationSpec],
) -> ModelFacts:
    """Model facts from a meta-device copy of the full model and the traced figures."""
    info = _model_info(meta, seq_len)
    found = find_block_stack(meta)
    return ModelFacts(
        name=name,
        parameters=info.parameters,
        trainable_parameters=info.trainable_parameters,
        embedding_parameters=info.embedding_parameters,
        largest_layer_parameters=info.largest_layer_parameters,
        parameter_sizes=tuple(info.parameter_sizes or ()) or None,
        largest_tied_parameters=info.largest_tied_parameters,
        buffers=sum(buf.numel() * buf.element_size() for buf in meta.buffers()),
        block_stack=found[0] if found else None,
        num_layers=len(found[1]) if found else 0,
        block_parameters=unique_parameter_count(found[1][0]) if found else None,
        hidden_size=info.hidden_size,
        num_attention_heads=info.num_attention_heads,
        seq_len=seq_len,
        activations=activations,
    )


def _file_forward(model_file: ModelFile) -> Forward:
    """The file's loss_fn, else ``model(**batch).loss`` (unchecked: fake values cannot be read)."""
    hook = getattr(model_file.module, "loss_fn", None)

    def forward(model: nn.Module, batch: Any) -> Any:
        if hook is not None:
            return model_file.call("loss_fn(model, batch)", hook, model, batch)
        if not isinstance(batch, dict):
            raise model_file.error("the batch is not a dict: define loss_fn(model, batch)")
        return model_file.call("model(**batch)", model, **batch).loss

    return forward


def _first_batch(model_file: ModelFile, batch_size: int) -> Any:
    stream = model_file.batches(batch_size, workers=0)
    try:
        return next(stream)
    finally:
        stream.close()  # type: ignore[attr-defined]


class _UncheckedRunner(TrainRunner):
    """A training step whose loss is not read: fake values have none."""

    def forward(self, batch: Any) -> torch.Tensor:
        with self.autocast():
            loss = _file_forward(self.model_file)(self.model, batch)
        return loss / self.grad_accum if self.grad_accum > 1 else loss


def trace_step(model_file: ModelFile, plan: Plan, batch: Any, *, fake: bool = True) -> TracedMoment:
    """The peak of one whole training step of ``plan``, and what was live then.

    The profile's own :func:`~autotune.runtime.profiler.tracked_step` (forward,
    backward, optimizer step under the live-tensor tracker) runs after one warm-up
    step, as in ``autotune profile``: the optimizer's state exists, the gradients
    were freed. On fake tensors (``fake``) nothing is allocated and ``batch``, fake,
    feeds both steps; otherwise it is a real step at ``plan``'s (small) micro-batch.
    """
    step, kind = _tracked(model_file, plan, batch, fake=fake)
    return TracedMoment(
        plan=plan,
        peak=step.peak.peak,
        at_peak=step.peak.at_peak,
        backward_at_peak=step.backward[1] if step.backward else None,
        optimizer_step=kind,  # type: ignore[arg-type]
    )


def _tracked(
    model_file: ModelFile, plan: Plan, batch: Any, *, fake: bool
) -> tuple[TrackedStep, str | None]:
    """One warm-up step of ``plan`` on ``batch``, then the profile's tracked step; with the
    optimizer step's path (:func:`autotune.runtime._memory.declared_step_kind`)."""
    runner_class = _UncheckedRunner if fake else TrainRunner
    runner = runner_class(
        model_file,
        micro_batch=plan.micro_batch,
        checkpoint_blocks=plan.checkpoint_blocks,
        precision=AUTOCAST[plan.precision],
    )
    runner.close()
    runner._batches = itertools.repeat(batch)
    try:
        loss = runner.forward(runner.next_batch())
        runner.backward(loss)
        del loss
        runner.optimizer_step()
        return tracked_step(runner), mem.declared_step_kind(runner.optimizer)
    finally:
        runner.close()


PATH_FAKE = "traced on fake tensors"
PATH_META_INIT = "traced on fake tensors, the model initialised on the meta device"
PATH_REAL = "measured in real steps at micro-batch {sizes}, scaled by the per-sample share"
PATHS = (PATH_FAKE, PATH_META_INIT, PATH_REAL)
"""The order the trace tries, each when the one before cannot run: fake tensors (nothing
allocated); the same after building the model on the meta device and ``to_empty`` (an init
that reads values, e.g. a truncated-normal init calling ``.item()``, cannot run on fake
tensors); a real forward and step at the two small batch sizes, whose linear fit scales to
any micro-batch (a kernel whose fake/meta implementation differs from the real one, e.g.
``_grouped_mm``'s dtype check, or data-dependent control flow). Only the last path's error
reaches the user: it is the one ``autotune profile`` would meet too."""

STATE_BYTES_PER_PARAMETER = 16
"""A real fp32 step with Adam holds the parameter, its gradient and two moments."""

SPREAD_BATCHES = 4
"""Batches a real-step trace counts at the larger size to see data-dependent activations
(mixture-of-experts routing); the figures are then the largest of them."""


@dataclass(frozen=True)
class _Traced:
    specs: dict[str, ActivationSpec]
    moment: TracedMoment | None
    counted: nn.Module


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ if isinstance(exc, AutotuneError) and exc.__cause__ else exc
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text[:160]}"


def _meta_initialised(model_file: ModelFile) -> ModelFile:
    """The file with ``build_model`` building on the meta device, then given empty tensors of the
    current mode (fake ones under tracing): the init never runs on fake values."""
    copied = copy.copy(model_file)

    def build() -> nn.Module:
        with torch.device("meta"):
            model = model_file.build_model()
        return _materialised(model)

    copied.build_model = build  # type: ignore[method-assign]
    return copied


def _materialised(model: nn.Module) -> nn.Module:
    """``model`` with every meta parameter and buffer replaced by an empty CPU one, tied
    parameters kept tied (``to_empty`` cannot swap parameters into fake tensors)."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in made:
                    empty = torch.empty_like(param, device="cpu")
                    made[id(param)] = nn.Parameter(empty, requires_grad=param.requires_grad)
                module._parameters[name] = made[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = torch.zeros_like(buffer, device="cpu")
    return model


def _fake_path(
    model_file: ModelFile,
    real: dict[int, Any],
    precisions: tuple[str, ...],
    meta: nn.Module,
    step: bool = True,
) -> _Traced:
    forward, sizes = _file_forward(model_file), (min(real), max(real))
    with _fake_tracing() as mode:

        def batch_of(b: int) -> Any:
            return _pytree.tree_map_only(torch.Tensor, mode.from_tensor, real[b])

        specs = {
            precision: trace_activations(
                model_file.build_model, batch_of, forward, precision=precision, batch_sizes=sizes
            )
            for precision in precisions
        }
        moment = _step_moment(model_file, sizes[-1], batch_of, real, fake=True) if step else None
    return _Traced(specs, moment, meta)


STEP_BATCH_FACTOR = 4
"""The whole step is traced at the larger fit size and at this many times it: the larger one's
peak, with more of it activations, is the one the estimator rescales to other micro-batches."""


def _step_moment(
    model_file: ModelFile,
    size: int,
    batch_of: Callable[[int], Any],
    real: dict[int, Any],
    *,
    fake: bool,
) -> TracedMoment:
    """The whole step traced at ``size`` and at :data:`STEP_BATCH_FACTOR` times it; the one whose
    peak holds the larger share of activations, carrying the optimizer step's transients when the
    smaller step peaked there (activations gone), which backward's peak does not show."""
    moment = trace_step(model_file, Plan(micro_batch=size), batch_of(size), fake=fake)
    larger = size * STEP_BATCH_FACTOR
    real.setdefault(larger, _first_batch(model_file, larger))
    later = trace_step(model_file, Plan(micro_batch=larger), batch_of(larger), fake=fake)
    if later.at_peak.activations / later.peak <= moment.at_peak.activations / moment.peak:
        return moment
    if moment.at_peak.activations > 0.1 * moment.peak:
        return later
    return later.model_copy(update={"optimizer_temporaries": float(moment.at_peak.temporaries)})


def _real_path(
    model_file: ModelFile, real: dict[int, Any], precisions: tuple[str, ...], step: bool = True
) -> tuple[_Traced, str]:
    """Real forwards and a real step at the small batch sizes; several batches at the larger
    one bound activations that depend on the data. Returns the figures and what bounds them."""
    forward, sizes = _file_forward(model_file), (min(real), max(real))
    specs = {
        precision: trace_activations(
            model_file.build_model,
            real.__getitem__,
            forward,
            precision=precision,
            batch_sizes=sizes,
        )
        for precision in precisions
    }
    counted = model_file.build_model()
    spread = _spread(model_file, counted, real[sizes[-1]], forward)
    low, high = min(spread), max(spread)
    scale = high / spread[0] if spread[0] else 1.0
    if scale > 1.0:
        specs = {name: _scaled(spec, scale) for name, spec in specs.items()}
    bound = (
        f"saved activations over {len(spread)} batches spread {100 * (high - low) / high:.1f} %"
        + (f", figures raised to the largest (x{scale:.3f}): a bound" if scale > 1.0 else "")
        if high
        else "no activations saved"
    )
    moment = (
        _step_moment(model_file, sizes[-1], real.__getitem__, real, fake=False) if step else None
    )
    return _Traced(specs, moment, counted), bound


def _spread(model_file: ModelFile, model: nn.Module, first: Any, forward: Forward) -> list[int]:
    """Saved activations of the fit's batch ``first``, then of more batches of its size
    (:data:`SPREAD_BATCHES` in all)."""
    size = next(t for t in _pytree.tree_leaves(first) if isinstance(t, torch.Tensor)).shape[0]
    stream = model_file.batches(size, workers=0)
    try:
        batches = [first, *(next(stream) for _ in range(SPREAD_BATCHES - 1))]
    finally:
        stream.close()  # type: ignore[attr-defined]
    return [_count(model, batch, forward, "fp32", 0).activations for batch in batches]


def _scaled(spec: ActivationSpec, factor: float) -> ActivationSpec:
    fields = ("fixed", "per_sample", "block_fixed", "block_per_sample")
    return spec.model_copy(update={f: getattr(spec, f) * factor for f in fields})


def _labelled(traced: _Traced, path: str) -> dict[str, ActivationSpec]:
    return {k: v.model_copy(update={"path": path}) for k, v in traced.specs.items()}


def facts_from_model_file(
    path: str | Path,
    *,
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS,
    batch_sizes: tuple[int, int] = (1, 2),
    real_step_limit: int | None = None,
    step: bool = True,
    cpu_scratch: int | None = None,
) -> ModelFacts:
    """A model file's activations at each precision, by the first of :data:`PATHS` that runs.

    The batches come from the file (small real inputs, turned into fake tensors on the
    fake paths); the model is counted on the meta device. A whole training step at the
    larger batch size is traced too (forward, backward, optimizer step), so the peak's
    temporaries come from the trace, not from zero. Each figure's ``path`` says which
    path it came from, and why the ones before it could not run.

    Args:
        real_step_limit: bytes the real-step path may take for the model's states (parameters,
            gradients, Adam's two moments: 16 per parameter); default: half the memory available.
        step: trace the whole training step too (``traced_moment``); without it only the
            activation figures are traced.
        cpu_scratch: plans run on a CPU, profiled at this micro-batch: a model with
            convolutions has its traced step carry the allocator's scratch of a real step at
            it (:func:`_with_cpu_scratch`).

    Raises:
        AutotuneError: anything wrong with the model file (what the real path meets), or
            a model over ``real_step_limit`` that no fake path can trace.
    """
    model_file = load_model_file(path)
    real = {b: _first_batch(model_file, b) for b in batch_sizes}
    seq_len = model_file.tokens_per_sample(real[batch_sizes[0]])
    failed: list[str] = []
    try:
        with torch.device("meta"):
            meta = model_file.build_model()
    except Exception as exc:  # the real path counts the real model instead
        failed.append(f"meta-device build: {_reason(exc)}")
        meta = None
    if real_step_limit is None:
        real_step_limit = real_step_room("cpu", "cpu")[0] or 0
    states = (
        None if meta is None
        else STATE_BYTES_PER_PARAMETER * sum(p.numel() for p in meta.parameters())
    )  # fmt: skip
    if meta is not None:
        for name, source in ((PATH_FAKE, model_file), (PATH_META_INIT, None)):
            try:
                source = source or _meta_initialised(model_file)
                traced = _fake_path(source, real, precisions, meta, step)
            except Exception as exc:  # the trace's limit, not the user's mistake
                failed.append(f"{name}: {_reason(exc)}")
                continue
            fits = states is not None and states <= real_step_limit
            if cpu_scratch and fits and traced.moment is not None and _has_convolutions(meta):
                moment = _with_cpu_scratch(model_file, traced.moment, cpu_scratch)
                traced = _Traced(traced.specs, moment, traced.counted)
                _notes.append(SCRATCH_NOTE)
            reasons = [*_notes, *(f"{f} failed" for f in failed)]
            label = name + (f" ({'; '.join(reasons)})" if reasons else "")
            return _model_file_facts(traced, seq_len, label)
    if states is not None and states > real_step_limit:
        raise model_file.error(
            f"no trace path can run without a real step of {states / 2**30:.1f} GiB of model "
            f"states, over the {real_step_limit / 2**30:.1f} GiB allowed ({'; '.join(failed)}); "
            "estimate from a profile on a machine that fits it (--profile)"
        )
    traced, bound = _real_path(model_file, real, precisions, step)
    why = "; ".join([*failed, bound])
    label = PATH_REAL.format(sizes=" and ".join(map(str, batch_sizes))) + f" ({why})"
    return _model_file_facts(traced, seq_len, label)


SCRATCH_NOTE = (
    "with the oneDNN scratch c10's allocator held in one real step at the profile's batch"
)


def _has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(module, nn.modules.conv._ConvNd) for module in model.modules())


def _with_cpu_scratch(model_file: ModelFile, moment: TracedMoment, batch: int) -> TracedMoment:
    """``moment`` with the oneDNN scratch of a real step at micro-batch ``batch`` added.

    oneDNN's convolutions allocate their scratch outside any tensor: a trace cannot see it
    and a CPU profile's allocator peak holds it (:func:`autotune.runtime._memory.with_allocator_peak`).
    So on a CPU, a model with convolutions (small enough for a real step) pays the steps
    ``autotune profile`` takes at ``batch`` (a warm-up, a tracked step, a plain one under c10's
    allocator), and the allocator's excess over the tracked tensors goes to the moment's
    temporaries, in proportion to the moment's micro-batch. The scratch does not follow the
    batch (oneDNN picks its algorithm per shape): read at the batch a profile would run, the
    estimator's rescaling gives back exactly that batch's scratch, as the profiled road does.
    """
    at = moment.plan.model_copy(update={"micro_batch": batch})
    step, _ = _tracked(model_file, at, _first_batch(model_file, batch), fake=False)
    scratch = step.peak.peak - (step.peak.live_tensors or step.peak.peak)
    extra = scratch * moment.plan.micro_batch / batch
    rebased = mem.with_allocator_peak(
        mem.PeakResult(moment.peak, moment.at_peak, "cpu_live_tensors"), int(moment.peak + extra)
    )
    return moment.model_copy(update={"peak": rebased.peak, "at_peak": rebased.at_peak})


def _model_file_facts(traced: _Traced, seq_len: int | None, label: str) -> ModelFacts:
    model = traced.counted
    facts = _facts(type(model).__name__, model, seq_len, _labelled(traced, label))
    step = traced.moment.optimizer_step if traced.moment else None
    return facts.model_copy(update={"traced_moment": traced.moment, "optimizer_step": step})


def traced_activations(path: str | Path, precisions: tuple[str, ...]) -> dict[str, ActivationSpec]:
    """A model file's activation figures at ``precisions``, traced (no whole step).

    What a profile at one precision lacks for plans at another: the 16-bit weights of a
    DeepSpeed or FSDP2 ``bf16`` plan do not halve fp32's saved bytes (a model keeps its norms',
    softmax's and loss's inputs in fp32: on the tiny Llama here 18 % more per sample than half
    of fp32's), so the figures are traced at that precision, each labelled with its path, and
    merged into the profile's facts (:func:`autotune.estimator.with_activations`).
    """
    if not precisions:
        return {}
    return facts_from_model_file(path, precisions=precisions, step=False).activations


def real_step_room(kind: str, device: str) -> tuple[int | None, str]:
    """Bytes a real step's model states may take on the device a profile would run on (its
    type ``kind``), and what that room is: the GPU's memory, or half this machine's available
    memory on a CPU (as the trace's real path allows)."""
    if kind == "cuda":
        return device_memory(device), "the GPU's memory"
    return int(psutil.virtual_memory().available // 2), "half this machine's available memory"


def real_step_parameters(path: str | Path) -> int | None:
    """The model file's parameters, counted on the meta device (nothing allocated); ``None``
    where its model cannot be built there."""
    model_file = load_model_file(path)
    try:
        with torch.device("meta"):
            return unique_parameter_count(model_file.build_model())
    except Exception:  # the profile will say what is wrong with it
        return None


def device_memory(device: str) -> int | None:
    """Bytes of the GPU ``device`` names (``auto``: this machine's first, where it has one);
    ``None`` for a CPU, or a GPU this machine does not have."""
    from autotune.runtime import _device

    if not device.startswith(("auto", "cuda")) or not torch.cuda.is_available():
        return None
    return _device.device_memory(torch.device("cuda" if device == "auto" else device))


def device_workspace(device: str) -> tuple[int, str]:
    """The cuBLAS workspace a training step on the GPU ``device`` names holds, and where the
    figure came from: measured on this machine's GPU where it has one
    (:func:`autotune.runtime._device.blas_workspace`), else assumed from torch's defaults
    (:func:`autotune.estimator.assumed_cublas_workspace`, ``CUBLAS_WORKSPACE_CONFIG`` read)."""
    from autotune.runtime import _device

    if torch.cuda.is_available():
        gpu = torch.device("cuda" if device == "auto" else device)
        return _device.blas_workspace(gpu), f"measured on {_device.device_name(gpu)}"
    return assumed_cublas_workspace(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def load_hf_config(path: str | Path) -> Any:
    """A transformers config from a ``config.json``, a model directory or a Hub name
    (:func:`autotune.runtime.hf.load_config`), without the KV cache, with SDPA attention.

    Raises:
        AutotuneError: naming the file when it is missing, not JSON, or not a known model type.
    """
    return hf.load_config(path)


WHOLE_TRACE_PARAMETERS = 2 * 10**9
"""Up to this many parameters a causal LM's config is traced whole, a whole step included (as
any other head); above it, on a few blocks scaled to L (seconds for 70B, no step traced)."""


def facts_from_hf_config(
    path: str | Path,
    seq_len: int,
    *,
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS,
    trace_layers: int = 2,
    batch_sizes: tuple[int, int] = (1, 2),
    task: str | None = None,
) -> ModelFacts:
    """Facts of a model described by a transformers config, without its memory.

    The task head comes from ``task``, else the config's ``architectures``
    (:func:`autotune.runtime.hf.task_of`). Parameters are counted on a meta-device build
    of the full model. A causal LM above :data:`WHOLE_TRACE_PARAMETERS` has its activations
    traced on fake tensors on a copy with ``trace_layers`` blocks (the blocks are identical)
    and scaled to the config's L, so a 70B config takes seconds; any other model, or a causal
    LM whose short trace cannot run, is traced whole through the model file ``--hf-config`` generates, by the first of
    :data:`PATHS` that runs (the real-step path only where the model fits in half the
    available memory).

    Raises:
        AutotuneError: a bad config file, task or sequence length; or no path that can run.
    """
    where = f"--hf-config {path}"
    config = load_hf_config(path)
    head = hf.task_of(config, task, where)
    config = hf.prepared_config(config, head, seq_len, where)
    meta = hf.check_buildable(config, where, head)
    failed = None
    if head == "causal-lm" and sum(p.numel() for p in meta.parameters()) > WHOLE_TRACE_PARAMETERS:
        try:
            return _short_causal_facts(config, meta, seq_len, precisions, trace_layers, batch_sizes)
        except Exception as exc:  # the trace's limit, not the user's mistake
            failed = f"{PATH_FAKE} on {trace_layers} blocks: {_reason(exc)}"
    text, _, stem = hf.hf_model_file(hf_config=str(path), seq_len=seq_len, task=task)
    with tempfile.TemporaryDirectory(prefix="autotune-hf-") as directory:
        file = Path(directory) / f"{stem}.py"
        file.write_text(text, encoding="utf-8")
        facts = facts_from_model_file(file, precisions=precisions, batch_sizes=batch_sizes)
    if failed is None:
        return facts
    specs = {
        k: v.model_copy(update={"path": f"{v.path}; {failed}"})
        for k, v in facts.activations.items()
    }
    return facts.model_copy(update={"activations": specs})


def _short_causal_facts(
    config: Any,
    meta: nn.Module,
    seq_len: int,
    precisions: tuple[str, ...],
    trace_layers: int,
    batch_sizes: tuple[int, int],
) -> ModelFacts:
    """A causal LM traced on fake tensors with ``trace_layers`` of its blocks, scaled to L."""
    layers = getattr(config, "num_hidden_layers", None)
    traced = min(trace_layers, layers or trace_layers)
    short = config.__class__.from_dict({**config.to_dict(), "num_hidden_layers": traced})
    short._attn_implementation = config._attn_implementation
    spec = hf.batch_spec(config, "causal-lm", seq_len, "--hf-config")
    specs = {}
    with _fake_tracing():
        for precision in precisions:
            specs[precision] = trace_activations(
                lambda: hf.auto_class("causal-lm").from_config(
                    short, dtype=torch.get_default_dtype()
                ),
                lambda b: hf.make_batch(spec, b),
                lambda m, batch: m(**batch).loss,
                precision=precision,
                layers=layers,
                batch_sizes=batch_sizes,
            )
    reasons = [*_notes, *([f"{traced} of {layers} blocks, scaled"] if layers != traced else [])]
    label = PATH_FAKE + (f" ({'; '.join(reasons)})" if reasons else "")
    specs = {k: v.model_copy(update={"path": label}) for k, v in specs.items()}
    return _facts(type(meta).__name__, meta, seq_len, specs)
