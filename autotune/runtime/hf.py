"""The Hugging Face entry: a transformers config (random init) or weights, fed synthetic token
batches, written out as a model file so profile, confirm and trial workers load it like any other.

A config is read from a ``config.json``, a model directory, or a Hub name (the last one needs
the network, as transformers does). Everything is checked in the parent, before any step runs:
the config builds a causal language model, and the sequence fits ``max_position_embeddings``.
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

    try:
        config = transformers.AutoConfig.from_pretrained(str(source), local_files_only=local)
    except Exception as exc:  # OSError (missing, offline), ValueError (unknown type)
        kind = "directory" if local else "name on the Hugging Face Hub (no such local file)"
        problem = f"cannot load a config from this {kind}: {_one_line(exc)}"
        raise AutotuneError(f"{where}: {problem}") from None
    return config_from_dict(config.to_dict(), where)


def check_seq_len(config: Any, seq_len: int, where: str) -> None:
    """A sequence of ``seq_len`` tokens must fit the config's positions.

    Raises:
        AutotuneError: ``seq_len`` below 1 or above ``max_position_embeddings``.
    """
    if seq_len < 1:
        raise AutotuneError(f"--seq-len: {seq_len} must be at least 1")
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and seq_len > limit:
        raise AutotuneError(
            f"--seq-len {seq_len}: above max_position_embeddings {limit} of {where}"
        )


def check_buildable(config: Any, where: str) -> nn.Module:
    """Build the causal LM on the meta device (no memory): the config must describe one.

    Raises:
        AutotuneError: transformers cannot build a causal language model from it.
    """
    import transformers

    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:
        raise AutotuneError(
            f"{where}: transformers cannot build a causal language model from it ({_one_line(exc)})"
        ) from None


def build_model(config: dict[str, Any], weights: str | None, attention: str) -> nn.Module:
    """The model a generated file builds: random init from ``config``, or ``weights`` loaded.

    Weights are fp32 (the profile's autocast keeps fp32 parameters), whatever the checkpoint holds.
    """
    import transformers

    cfg = config_from_dict(config, "generated model file", attention)
    dtype = torch.get_default_dtype()
    if weights is None:
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return transformers.AutoModelForCausalLM.from_pretrained(weights, config=cfg, dtype=dtype)


def token_batch(vocab_size: int, seq_len: int, batch_size: int) -> dict[str, torch.Tensor]:
    """Random token ids; labels = inputs (the model shifts them)."""
    ids = torch.randint(0, vocab_size, (batch_size, seq_len))
    return {"input_ids": ids, "labels": ids.clone()}


_TEMPLATE = '''"""Generated by autotune for {label}: {what}, synthetic token batches."""

import json

from autotune.runtime import hf

CONFIG = json.loads({config!r})
WEIGHTS = {weights!r}
ATTENTION = {attention!r}
VOCAB_SIZE = {vocab!r}
SEQ_LEN = {seq_len!r}


def build_model():
    return hf.build_model(CONFIG, WEIGHTS, ATTENTION)


def build_batch(batch_size):
    return hf.token_batch(VOCAB_SIZE, SEQ_LEN, batch_size)
'''


def _stem(source: str) -> str:
    path = Path(source)
    name = path.parent.name if path.name == "config.json" else (path.stem or path.name)
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "hf"


def hf_model_file(
    *, hf_config: str | None = None, hf_model: str | None = None, seq_len: int
) -> tuple[str, str, str]:
    """A model file for a config or weights: its text, label and stem; all checked first.

    Raises:
        AutotuneError: a config that cannot be read or built, or a bad ``seq_len``.
    """
    flag, source = ("--hf-model", hf_model) if hf_model is not None else ("--hf-config", hf_config)
    assert source is not None
    where = f"{flag} {source}"
    config = load_config(source, flag)
    check_seq_len(config, seq_len, where)
    check_buildable(config, where)
    if not isinstance(getattr(config, "vocab_size", None), int):
        raise AutotuneError(f"{where}: no vocab_size (needed for the synthetic token batches)")
    label = f"{flag.lstrip('-')} {source} --seq-len {seq_len}"
    weights = (
        str(Path(source).expanduser().resolve()) if hf_model and Path(source).is_dir() else hf_model
    )
    text = _TEMPLATE.format(
        label=label,
        what="weights from_pretrained" if weights else "random init from the config",
        config=json.dumps(config.to_diff_dict(), sort_keys=True),
        weights=weights,
        attention=config._attn_implementation,
        vocab=config.vocab_size,
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
        if seq_len is not None:
            raise AutotuneError(
                "--seq-len: only with --hf-config or --hf-model (a model file makes its own batches)"
            )
        path = Path(model)
        yield ModelSource(path, str(path.expanduser().resolve()), path.stem)
        return
    if seq_len is None:
        raise AutotuneError(f"{given[0]} needs --seq-len (tokens per sample)")
    text, label, stem = hf_model_file(hf_config=hf_config, hf_model=hf_model, seq_len=seq_len)
    with tempfile.TemporaryDirectory(prefix="autotune-hf-") as directory:
        path = Path(directory) / f"{stem}.py"
        path.write_text(text, encoding="utf-8")
        yield ModelSource(path, label, stem)
