"""The Hugging Face entry: a transformers config (random init) or weights, fed synthetic batches
of the kind its task head takes, written out as a model file so profile, confirm and trial workers
load it like any other.

A config is read from a ``config.json``, a model directory, or a Hub name (the last one needs
the network, as transformers does). The task head comes from ``--task``, else from the config's
``architectures`` (``BertForMaskedLM`` -> masked LM), else it is a causal LM. Everything is
checked in the parent, before any step runs: the config builds the head, and the sequence fits
``max_position_embeddings``.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.records import AutotuneError

ATTENTION = "sdpa"
"""The attention a config gets when it names none (stated, as transformers' default may change)."""

TASKS: dict[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
    "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
    "ctc": "AutoModelForCTC",
    "contrastive": "AutoModel",
}
"""Each task head and the transformers auto class that builds it (``contrastive``: CLIP-style
models whose base class returns a loss with ``return_loss=True``)."""

_NAMES = {
    "causal-lm": "causal language model",
    "masked-lm": "masked language model",
    "seq2seq-lm": "sequence-to-sequence language model",
    "speech-seq2seq": "speech-to-text model",
    "ctc": "CTC speech model",
    "contrastive": "contrastive (CLIP-style) model",
}

_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForPreTraining", "masked-lm"),
    ("ForSequenceClassification", "sequence-classification"),
    ("ForImageClassification", "image-classification"),
    ("ForCTC", "ctc"),
    ("ForConditionalGeneration", "seq2seq-lm"),
    ("ForSpeechSeq2Seq", "speech-seq2seq"),
)
IMAGE_TASKS = ("image-classification",)
"""Tasks whose ``--seq-len`` is the image side in pixels."""


@dataclass(frozen=True)
class ModelSource:
    """The model file a command runs, and how records name it.

    Attributes:
        path: a model file: the user's own, or one generated from a Hugging Face entry.
        label: the user's file, or e.g. ``hf-config configs/tiny.json --seq-len 128``.
        stem: a short name for studies (the file's stem, or the config's with the length).
    """

    path: Path
    label: str
    stem: str


def _one_line(exc: BaseException) -> str:
    """The innermost cause, on one line: config validators wrap their ValueError."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def config_from_dict(data: dict[str, Any], where: str, attention: str | None = None) -> Any:
    """A transformers config from its ``to_dict()`` form (``model_type`` names the class),
    without the KV cache, with ``attention`` (else the config's own, else :data:`ATTENTION`).

    Raises:
        AutotuneError: naming ``where`` for an unknown model type or values it rejects.
    """
    import transformers

    if not isinstance(data, dict) or "model_type" not in data:
        raise AutotuneError(f"{where}: no model_type field (not a transformers config)")
    values = dict(data)
    kind = values.pop("model_type")
    try:
        config = transformers.AutoConfig.for_model(kind, **values)
    except Exception as exc:  # ValueError, TypeError, huggingface_hub's validation errors
        raise AutotuneError(f"{where}: model_type {kind!r}: {_one_line(exc)}") from None
    config.use_cache = False
    config._attn_implementation = (
        attention or getattr(config, "_attn_implementation", None) or ATTENTION
    )
    return config


def _looks_local(source: str) -> bool:
    """A path rather than a Hub name (``org/name``): a .json file, a path-like start or end, or
    more than one folder."""
    return (
        source.endswith((".json", "/"))
        or source.startswith((".", "/", "~"))
        or source.count("/") > 1
    )


HUB_PROBE_S = 3.0
"""Seconds to wait for a TCP connection to the Hub before calling it unreachable."""


def _cached_hub_config(name: str) -> Any | None:
    """The Hub name's config from the local cache, without the network; ``None`` if absent."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception:  # not cached (OSError) or not readable: the Hub decides
        return None


def _check_hub_reachable(where: str) -> None:
    """Fail at once, on one line, when the Hub's host cannot be reached: huggingface_hub
    would retry each download five times (about 25 s) before saying the same.

    Behind a proxy (``HTTPS_PROXY``, ``ALL_PROXY``) or with ``HF_HUB_OFFLINE`` the Hub
    library decides, as it does every time the host answers.
    """
    import os
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if constants.HF_HUB_OFFLINE or any(os.environ.get(name) for name in proxies):
        return
    url = urlsplit(constants.ENDPOINT)
    host, port = (
        url.hostname or "huggingface.co",
        url.port or (443 if url.scheme == "https" else 80),
    )
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
    except OSError as exc:
        raise AutotuneError(
            f"{where}: not in the local Hugging Face cache and {host} cannot be reached "
            f"({exc.strerror or type(exc).__name__}); give a local config.json or model directory"
        ) from None


def load_config(source: str | Path, flag: str = "--hf-config") -> Any:
    """A transformers config from a ``config.json``, a model directory, or a Hub name.

    Raises:
        AutotuneError: naming the flag and the source when it cannot be read.
    """
    path = Path(source).expanduser()
    where = f"{flag} {source}"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AutotuneError(f"{where}: cannot read JSON ({exc})") from None
        return config_from_dict(data, where)
    local = path.is_dir()
    if not local and _looks_local(str(source)):
        raise AutotuneError(f"{where}: no such file or directory")
    import transformers

    if not local:
        cached = _cached_hub_config(str(source))
        if cached is not None:
            return config_from_dict(cached.to_dict(), where)
        _check_hub_reachable(where)
    try:
        config = transformers.AutoConfig.from_pretrained(str(source), local_files_only=local)
    except Exception as exc:  # OSError (missing, offline), ValueError (unknown type)
        kind = "directory" if local else "name on the Hugging Face Hub (no such local file)"
        problem = f"cannot load a config from this {kind}: {_one_line(exc)}"
        raise AutotuneError(f"{where}: {problem}") from None
    return config_from_dict(config.to_dict(), where)


def task_of(config: Any, task: str | None, where: str) -> str:
    """The task head: ``task`` when given, else the config's first ``architectures`` entry
    (by its suffix; a model type transformers lists as speech-to-text makes ``speech-seq2seq``),
    else ``causal-lm``.

    Raises:
        AutotuneError: an unknown ``task``, or an architecture no task matches.
    """
    if task is not None:
        if task not in TASKS:
            raise AutotuneError(f"--task {task}: not one of {', '.join(TASKS)}")
        return task
    names = getattr(config, "architectures", None) or []
    if not names:
        return "causal-lm"
    name = str(names[0])
    if name == f"{type(config).__name__.removesuffix('Config')}Model" and _has(
        config, "text_config"
    ):
        return "contrastive"
    for suffix, found in _SUFFIXES:
        if name.endswith(suffix):
            if found == "seq2seq-lm" and _is_speech(config):
                return "speech-seq2seq"
            return found
    raise AutotuneError(
        f"{where}: architecture {name} has no task head autotune knows; "
        f"give --task ({', '.join(TASKS)})"
    )


def _has(config: Any, name: str) -> bool:
    return getattr(config, name, None) is not None


def _is_speech(config: Any) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES

    return config.model_type in MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES


def check_seq_len(config: Any, seq_len: int, where: str, task: str = "causal-lm") -> None:
    """A sequence of ``seq_len`` tokens must fit the config's positions (an image side and a
    CTC model's audio samples are not positions).

    Raises:
        AutotuneError: ``seq_len`` below 1 or above ``max_position_embeddings``.
    """
    if seq_len < 1:
        raise AutotuneError(f"--seq-len: {seq_len} must be at least 1")
    if task in (*IMAGE_TASKS, "ctc"):
        return
    text = getattr(config, "text_config", None) if task == "contrastive" else config
    limit = getattr(text, "max_position_embeddings", None)
    if task == "speech-seq2seq":
        limit = getattr(config, "max_target_positions", None)
    if isinstance(limit, int) and seq_len > limit:
        raise AutotuneError(
            f"--seq-len {seq_len}: above max_position_embeddings {limit} of {where}"
        )


def auto_class(task: str) -> Any:
    """The transformers auto class of a task head."""
    import transformers

    return getattr(transformers, TASKS[task])


def check_buildable(config: Any, where: str, task: str = "causal-lm") -> nn.Module:
    """Build the task's model on the meta device (no memory): the config must describe one.

    A model that refuses SDPA (no attention at all: Mamba, ResNet) gets ``eager``, in the
    config itself, so the generated file builds it the same way.

    Raises:
        AutotuneError: transformers cannot build that head from it.
    """
    for attempt in range(2):
        try:
            with torch.device("meta"):
                return auto_class(task).from_config(config)  # type: ignore[no-any-return]
        except Exception as exc:
            if attempt == 0 and "attention implementation" in str(exc):
                config._attn_implementation = "eager"
                continue
            raise AutotuneError(
                f"{where}: transformers cannot build a {_NAMES.get(task, task.replace('-', ' ') + ' model')} "
                f"from it ({_one_line(exc)})"
            ) from None
    raise AssertionError("unreachable")


def build_model(
    config: dict[str, Any], weights: str | None, attention: str, task: str = "causal-lm"
) -> nn.Module:
    """The model a generated file builds: random init from ``config``, or ``weights`` loaded.

    Weights are fp32 (the profile's autocast keeps fp32 parameters), whatever the checkpoint holds.
    """
    cfg = config_from_dict(config, "generated model file", attention)
    dtype = torch.get_default_dtype()
    if weights is None:
        return auto_class(task).from_config(cfg, dtype=dtype)  # type: ignore[no-any-return]
    return auto_class(task).from_pretrained(weights, config=cfg, dtype=dtype)  # type: ignore[no-any-return]


def token_batch(vocab_size: int, seq_len: int, batch_size: int) -> dict[str, torch.Tensor]:
    """Random token ids; labels = inputs (the model shifts them)."""
    ids = torch.randint(0, vocab_size, (batch_size, seq_len))
    return {"input_ids": ids, "labels": ids.clone()}


def _ctc_frames(config: Any, samples: int) -> int:
    """Frames a wav2vec2-style feature encoder makes of ``samples`` (its convolutions' arithmetic)."""
    for kernel, stride in zip(config.conv_kernel, config.conv_stride, strict=False):
        samples = (samples - kernel) // stride + 1
    return samples


def batch_spec(config: Any, task: str, seq_len: int, where: str) -> dict[str, list[Any]]:
    """What a batch of the task holds, per field: ``[kind, high or fill, *shape per sample]``.

    Kinds: ``ids`` (random integers below ``high``), ``float`` (normal noise), ``same`` (a copy
    of the field named second), ``flag`` (the value second). JSON-able, so a generated model
    file carries it.

    Raises:
        AutotuneError: the config lacks a number the batch needs (named), or a CTC input too
            short for one frame.
    """

    def need(owner: Any, name: str) -> int:
        value = getattr(owner, name, None)
        if not isinstance(value, int) or isinstance(value, bool):
            raise AutotuneError(f"{where}: no {name} (needed for the synthetic {task} batches)")
        return value

    if task in ("causal-lm", "masked-lm"):
        return {
            "input_ids": ["ids", need(config, "vocab_size"), seq_len],
            "labels": ["same", "input_ids"],
        }
    if task == "seq2seq-lm":
        vocab = need(config, "vocab_size")
        return {"input_ids": ["ids", vocab, seq_len], "labels": ["ids", vocab, seq_len]}
    if task == "sequence-classification":
        ids = ["ids", need(config, "vocab_size"), seq_len]
        return {"input_ids": ids, "labels": ["ids", need(config, "num_labels")]}
    if task in IMAGE_TASKS:
        pixels = ["float", 0, need(config, "num_channels"), seq_len, seq_len]
        return {"pixel_values": pixels, "labels": ["ids", need(config, "num_labels")]}
    if task == "speech-seq2seq":
        frames = 2 * need(config, "max_source_positions")
        features = ["float", 0, need(config, "num_mel_bins"), frames]
        return {"input_features": features, "labels": ["ids", need(config, "vocab_size"), seq_len]}
    if task == "ctc":
        frames = _ctc_frames(config, seq_len)
        if frames < 2:
            raise AutotuneError(
                f"--seq-len {seq_len}: too few audio samples for 2 frames of {where}"
            )
        # 1 and up: 0 is the blank/padding token a CTC head ignores
        return {
            "input_values": ["float", 0, seq_len],
            "labels": ["ids", need(config, "vocab_size"), frames // 2],
        }
    text, vision = config.text_config, config.vision_config
    pixels = [
        "float",
        0,
        need(vision, "num_channels"),
        need(vision, "image_size"),
        vision.image_size,
    ]
    ids = ["ids", need(text, "vocab_size"), seq_len]
    return {"input_ids": ids, "pixel_values": pixels, "return_loss": ["flag", True]}


def make_batch(spec: dict[str, list[Any]], batch_size: int) -> dict[str, Any]:
    """A random batch of ``batch_size`` samples as :func:`batch_spec` describes it."""
    batch: dict[str, Any] = {}
    for name, (kind, value, *shape) in spec.items():
        if kind == "ids":
            low = 1 if name == "labels" and value > 2 else 0
            batch[name] = torch.randint(low, value, (batch_size, *shape))
        elif kind == "float":
            batch[name] = torch.randn(batch_size, *shape)
        elif kind == "same":
            batch[name] = batch[value].clone()
        else:
            batch[name] = value
    return batch


_TEMPLATE = '''"""Generated by autotune for {label}: {what}, {task} head, synthetic batches."""

import json

from autotune.runtime import hf

CONFIG = json.loads({config!r})
WEIGHTS = {weights!r}
ATTENTION = {attention!r}
TASK = {task!r}
BATCH = json.loads({batch!r})
TOKENS_PER_SAMPLE = {seq_len!r}


def build_model():
    return hf.build_model(CONFIG, WEIGHTS, ATTENTION, TASK)


def build_batch(batch_size):
    return hf.make_batch(BATCH, batch_size)
'''


def _stem(source: str) -> str:
    path = Path(source)
    name = path.parent.name if path.name == "config.json" else (path.stem or path.name)
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "hf"


def prepared_config(config: Any, task: str, seq_len: int, where: str) -> Any:
    """The config checked for ``task`` at ``seq_len``: an image model's side set to ``seq_len``,
    a padding token for a classifier that pools the last token (a batch of several needs one).

    Raises:
        AutotuneError: a bad ``seq_len``, or a config that cannot build the head.
    """
    check_seq_len(config, seq_len, where, task)
    if task in IMAGE_TASKS and _has(config, "image_size"):
        config.image_size = seq_len
    if task == "sequence-classification" and getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = 0
    check_buildable(config, where, task)
    return config


def hf_model_file(
    *,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int,
    task: str | None = None,
) -> tuple[str, str, str]:
    """A model file for a config or weights: its text, label and stem; all checked first.

    Raises:
        AutotuneError: a config that cannot be read or built, or a bad ``seq_len`` or ``task``.
    """
    flag, source = ("--hf-model", hf_model) if hf_model is not None else ("--hf-config", hf_config)
    assert source is not None
    where = f"{flag} {source}"
    config = load_config(source, flag)
    head = task_of(config, task, where)
    config = prepared_config(config, head, seq_len, where)
    spec = batch_spec(config, head, seq_len, where)
    label = f"{flag.lstrip('-')} {source} --seq-len {seq_len}"
    label += f" --task {task}" if task is not None else ""
    weights = (
        str(Path(source).expanduser().resolve()) if hf_model and Path(source).is_dir() else hf_model
    )
    text = _TEMPLATE.format(
        label=label,
        what="weights from_pretrained" if weights else "random init from the config",
        config=json.dumps(config.to_diff_dict(), sort_keys=True),
        weights=weights,
        attention=config._attn_implementation,
        task=head,
        batch=json.dumps(spec),
        seq_len=seq_len,
    )
    return text, label, f"{_stem(str(source))}_s{seq_len}"


@contextlib.contextmanager
def model_source(
    model: str | Path | None,
    *,
    hf_config: str | None = None,
    hf_model: str | None = None,
    seq_len: int | None = None,
    task: str | None = None,
) -> Iterator[ModelSource]:
    """The one entry every command shares: MODEL, or a model file generated from a Hugging Face
    config (``hf_config``) or weights (``hf_model``), which lives until the block ends.

    Raises:
        AutotuneError: none or several of the three given, ``seq_len`` missing or misplaced,
            or anything :func:`hf_model_file` rejects.
    """
    entries = (("MODEL", model), ("--hf-config", hf_config), ("--hf-model", hf_model))
    given = [name for name, value in entries if value is not None]
    if len(given) > 1:
        raise AutotuneError(f"{' and '.join(given)}: give one of them")
    if not given:
        raise AutotuneError("MODEL: give a model file, --hf-config or --hf-model")
    if model is not None:
        for flag, value in (("--seq-len", seq_len), ("--task", task)):
            if value is not None:
                raise AutotuneError(
                    f"{flag}: only with --hf-config or --hf-model (a model file makes its own batches)"
                )
        path = Path(model)
        yield ModelSource(path, str(path.expanduser().resolve()), path.stem)
        return
    if seq_len is None:
        raise AutotuneError(f"{given[0]} needs --seq-len (tokens per sample)")
    text, label, stem = hf_model_file(
        hf_config=hf_config, hf_model=hf_model, seq_len=seq_len, task=task
    )
    with tempfile.TemporaryDirectory(prefix="autotune-hf-") as directory:
        path = Path(directory) / f"{stem}.py"
        path.write_text(text, encoding="utf-8")
        yield ModelSource(path, label, stem)
