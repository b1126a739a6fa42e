"""Activation figures traced without allocating: FakeTensorMode forwards of a model file or HF config.

Parameters are counted on the meta device; saved-for-backward bytes are counted
with the profiler's own counter (``memory.count_saved_tensors``) during forwards
on fake tensors, at two batch sizes and with no / all blocks checkpointed, so the
fixed, per-sample, per-block and checkpointed-input parts come out exactly as a
real forward would save them.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree

from autotune.estimator import ActivationSpec, ModelFacts, TracedMoment
from autotune.records import Plan
from autotune.runtime import _blocks as blocks
from autotune.runtime import _memory as mem
from autotune.runtime import hf
from autotune.runtime._blocks import apply_checkpointing, find_block_stack, unique_parameter_count
from autotune.runtime._step import AUTOCAST, TrainRunner
from autotune.runtime.modelfile import ModelFile, load_model_file
from autotune.runtime.profiler import _model_info, tracked_step

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


def _smallest_block(saved: mem.SavedTensors) -> int:
    """One block's bytes: the smallest block (the first may also hold tensors all blocks share)."""
    return min(size for name, size in saved.by_module.items() if name != mem.OTHER)


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
        block = _smallest_block(plain) if traced else 0
        outside = plain.activations - traced * block
        kept = _count(model, batch, forward, precision, traced) if traced else plain
        block_input = (kept.activations - outside) / traced if traced else 0.0
        # a checkpointed block saves no weight copies: they are made again in its recompute
        copies = plain.autocast_weight_copies
        block_copies = (copies - kept.autocast_weight_copies) / traced if traced else 0.0
        points.append((b, outside + real * block, block, block_input, copies, block_copies))
    (b1, total1, blk1, in1, copies, block_copies), (b2, total2, blk2, in2, _, _) = points
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


def trace_step(model_file: ModelFile, plan: Plan, batch: Any) -> TracedMoment:
    """The peak of one whole training step of ``plan`` on fake tensors, and what was live then.

    The profile's own :func:`~autotune.runtime.profiler.tracked_step` (forward,
    backward, optimizer step under the live-tensor tracker) runs after one warm-up
    step, as in ``autotune profile``: the optimizer's state exists, the gradients
    were freed. Nothing is allocated. ``batch``, fake, feeds both steps.
    """
    runner = _UncheckedRunner(
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
        step = tracked_step(runner)
    finally:
        runner.close()
    return TracedMoment(plan=plan, peak=step.peak.peak, at_peak=step.peak.at_peak)


def facts_from_model_file(
    path: str | Path,
    *,
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS,
    batch_sizes: tuple[int, int] = (1, 2),
) -> ModelFacts:
    """Trace a model file's activations at each precision without allocating its tensors.

    The batches come from the file (small real inputs, turned into fake tensors);
    the model is built on the meta device (counts) and under FakeTensorMode (trace).

    A whole training step at the larger batch size is traced too (forward, backward,
    optimizer step), so the peak's temporaries come from the trace, not from zero.

    Raises:
        AutotuneError: anything wrong with the model file.
    """
    model_file = load_model_file(path)
    with torch.device("meta"):
        meta = model_file.build_model()
    real = {b: _first_batch(model_file, b) for b in batch_sizes}
    seq_len = model_file.tokens_per_sample(real[batch_sizes[0]])
    forward = _file_forward(model_file)
    specs = {}
    with _fake_tracing() as mode:

        def batch_of(b: int) -> Any:
            return _pytree.tree_map_only(torch.Tensor, mode.from_tensor, real[b])

        for precision in precisions:
            specs[precision] = trace_activations(
                model_file.build_model,
                batch_of,
                forward,
                precision=precision,
                batch_sizes=batch_sizes,
            )
        moment = trace_step(
            model_file, Plan(micro_batch=batch_sizes[-1]), batch_of(batch_sizes[-1])
        )
    facts = _facts(type(meta).__name__, meta, seq_len, specs)
    return facts.model_copy(update={"traced_moment": moment})


def load_hf_config(path: str | Path) -> Any:
    """A transformers config from a ``config.json``, a model directory or a Hub name
    (:func:`autotune.runtime.hf.load_config`), without the KV cache, with SDPA attention.

    Raises:
        AutotuneError: naming the file when it is missing, not JSON, or not a known model type.
    """
    return hf.load_config(path)


def facts_from_hf_config(
    path: str | Path,
    seq_len: int,
    *,
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS,
    trace_layers: int = 2,
    batch_sizes: tuple[int, int] = (1, 2),
) -> ModelFacts:
    """Facts of a causal LM described by a local transformers config, without its memory.

    Parameters are counted on a meta-device build of the full model; activations
    are traced on a copy with ``trace_layers`` blocks (the blocks are identical)
    and scaled to the config's L, so a 70B config takes seconds.

    Raises:
        AutotuneError: a bad config file or sequence length.
    """
    import transformers

    config = load_hf_config(path)
    config._attn_implementation = "sdpa"
    hf.check_seq_len(config, seq_len, f"--hf-config {path}")
    meta = hf.check_buildable(config, f"--hf-config {path}")
    layers = getattr(config, "num_hidden_layers", None)
    short = config.__class__.from_dict(
        {**config.to_dict(), "num_hidden_layers": min(trace_layers, layers or trace_layers)}
    )
    short._attn_implementation = "sdpa"
    vocab = int(getattr(config, "vocab_size", 2))
    specs = {}
    with _fake_tracing():

        def batch_of(b: int) -> Any:
            ids = torch.randint(0, vocab, (b, seq_len))
            return {"input_ids": ids, "labels": ids}

        for precision in precisions:
            specs[precision] = trace_activations(
                lambda: transformers.AutoModelForCausalLM.from_config(
                    short, dtype=torch.get_default_dtype()
                ),
                batch_of,
                lambda m, batch: m(**batch).loss,
                precision=precision,
                layers=layers,
                batch_sizes=batch_sizes,
            )
    return _facts(type(meta).__name__, meta, seq_len, specs)
