"""What profile, confirm and tune share to name the model: MODEL, or a Hugging Face config or
weights with a sequence length (the options, and the one loader they call)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from autotune.runtime.hf import ModelSource

MODEL = typer.Argument(
    None,
    help="The model file (build_model, build_batch or build_dataloader); "
    "omit it with --hf-config or --hf-model.",
)
HF_CONFIG = typer.Option(
    None,
    "--hf-config",
    help="Instead of MODEL: a transformers config.json, model directory or Hub name; "
    "random init, synthetic token batches (with --seq-len).",
)
HF_MODEL = typer.Option(
    None,
    "--hf-model",
    help="Instead of MODEL: weights to load with from_pretrained (a local directory, "
    "or a Hub name where there is internet); synthetic token batches (with --seq-len).",
)
SEQ_LEN = typer.Option(
    None,
    "--seq-len",
    min=1,
    help="Tokens per sample with --hf-config / --hf-model (an image classifier: the image side "
    "in pixels; a CTC speech model: audio samples).",
)
_HEADS = (
    "the head to build (causal-lm, masked-lm, seq2seq-lm, sequence-classification, "
    "image-classification, speech-seq2seq, ctc, contrastive); default: from the config's "
    "architectures, else causal-lm."
)
TASK = typer.Option(None, "--task", help=f"With --hf-config / --hf-model: {_HEADS}")
CONFIG_TASK = typer.Option(None, "--task", help=f"With --hf-config: {_HEADS}")
"""``--task`` of a command that takes --hf-config but not --hf-model (estimate)."""


def model_source(
    model: Path | None,
    hf_config: str | None,
    hf_model: str | None,
    seq_len: int | None,
    task: str | None = None,
) -> AbstractContextManager[ModelSource]:
    """:func:`autotune.runtime.hf.model_source`, imported only when a command runs."""
    from autotune.runtime.hf import model_source as open_source

    return open_source(model, hf_config=hf_config, hf_model=hf_model, seq_len=seq_len, task=task)


def source_args(
    model: Path | None,
    hf_config: str | None,
    hf_model: str | None,
    seq_len: int | None,
    task: str | None = None,
) -> list[str]:
    """The command-line words that named the model, for a record's command."""
    words = [str(model)] if model is not None else []
    words += ["--hf-config", hf_config] if hf_config is not None else []
    words += ["--hf-model", hf_model] if hf_model is not None else []
    words += ["--seq-len", str(seq_len)] if seq_len is not None else []
    return words + (["--task", task] if task is not None else [])
