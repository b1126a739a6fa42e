"""Traced facts of a transformers config, kept on disk: the same config file, sequence length,
precisions and library versions answer again without importing torch or transformers.

A config is plain JSON, so its bytes (with the versions of autotune, torch and transformers
that traced it) say everything the trace depends on; model files run user code and are
never cached. The cache lives in ``$AUTOTUNE_CACHE_DIR`` (default ``~/.cache/autotune``).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from autotune import __version__
from autotune.estimator import ModelFacts
from autotune.records import atomic_write_text

TRACE_VERSION = 5
"""Bumped when the trace itself changes what it measures."""


def cache_dir() -> Path:
    """Where traced facts are kept."""
    return Path(os.environ.get("AUTOTUNE_CACHE_DIR") or "~/.cache/autotune").expanduser()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def entry(
    config: str | Path, seq_len: int, precisions: tuple[str, ...], task: str | None = None
) -> Path | None:
    """The cache file for this trace (``None``: the config cannot be read, so never cached)."""
    try:
        data = Path(config).read_bytes()
    except OSError:
        return None
    key = json.dumps([TRACE_VERSION, __version__, _version("torch"), _version("transformers"),
                      hashlib.sha256(data).hexdigest(), seq_len, sorted(precisions), task])  # fmt: skip
    return cache_dir() / "traces" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def facts_from_hf_config_cached(
    config: str | Path, seq_len: int, precisions: tuple[str, ...], task: str | None = None
) -> tuple[ModelFacts, bool]:
    """:func:`autotune.runtime.trace.facts_from_hf_config`, from the cache when it has it.

    Returns:
        The facts, and whether they came from the cache.
    """
    path = entry(config, seq_len, precisions, task)
    if path is not None and path.is_file():
        try:
            return ModelFacts.model_validate_json(path.read_text(encoding="utf-8")), True
        except (OSError, ValueError):
            pass  # unreadable or from an older schema: trace again
    from autotune.runtime.trace import facts_from_hf_config

    facts = facts_from_hf_config(config, seq_len, precisions=precisions, task=task)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, facts.model_dump_json())
        except OSError:
            pass  # a read-only home only costs the next run its trace
    return facts, False
