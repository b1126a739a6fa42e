"""Checks a config with DeepSpeed's own parser for a target world size, without launching ranks."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

from autotune.records import AutotuneError


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Keep DeepSpeed's prints and stdout log handler off our stdout (``--json`` output)."""
    moved = []
    for handler in logging.getLogger("DeepSpeed").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stdout,
            sys.__stdout__,
        ):
            moved.append((handler, handler.setStream(sys.stderr)))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for handler, stream in moved:
            handler.setStream(stream)


def deepspeed_version() -> str | None:
    """The installed DeepSpeed's version, or ``None`` when it cannot be imported."""
    try:
        with _stdout_to_stderr():
            import torch

            if not torch.cuda.is_available():
                # Else DeepSpeed prints an accelerator warning on import (on our stdout).
                os.environ.setdefault("DS_ACCELERATOR", "cpu")
            import deepspeed
    except Exception:  # absent or broken (e.g. no torch): both mean "cannot check"
        return None
    return str(deepspeed.__version__)


def validate_with_deepspeed(config: dict[str, Any], *, world_size: int) -> str | None:
    """Parse ``config`` with ``DeepSpeedConfig`` as if ``world_size`` ranks were running.

    DeepSpeed reads the rank and world size from ``deepspeed.comm``; both are
    patched (with only the world size patched, its fallback resets it to 1).

    Returns:
        The DeepSpeed version that accepted it, or ``None`` when DeepSpeed is not
        importable here (then only autotune's own checks ran).

    Raises:
        AutotuneError: DeepSpeed's complaint, on one line.
    """
    version = deepspeed_version()
    if version is None:
        return None
    with _stdout_to_stderr():
        from deepspeed.runtime import config as ds_config

        try:
            with (
                mock.patch.object(ds_config.dist, "get_rank", return_value=0),
                mock.patch.object(ds_config.dist, "get_world_size", return_value=world_size),
            ):
                ds_config.DeepSpeedConfig(copy.deepcopy(config))
        except Exception as exc:  # assertions, pydantic and ValueErrors alike
            raise AutotuneError(
                f"DeepSpeed {version} rejects the config: {_one_line(exc)}"
            ) from None
    return version


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
