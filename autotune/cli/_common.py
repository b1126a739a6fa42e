"""What every command shares: the error boundary, the debug switch, JSON output."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from autotune.records import AutotuneError

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console


class _LazyConsole:
    """A rich Console made on first use: importing rich costs ~0.1 s that --help need not pay."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def get(self) -> Console:
        """The real Console (for APIs that need one, e.g. rich's Progress)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=self._stderr, highlight=False)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


console = _LazyConsole(stderr=False)
err_console = _LazyConsole(stderr=True)


class PrecisionChoice(StrEnum):
    """``--precision`` of profile and estimate: fp32, or autocast to a 16-bit type."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Switch(StrEnum):
    """An off/on option such as ``--checkpointing``."""

    off = "off"
    on = "on"


def debug_enabled() -> bool:
    """Whether tracebacks should be shown (``autotune --debug`` or AUTOTUNE_DEBUG=1)."""
    return os.environ.get("AUTOTUNE_DEBUG", "") not in ("", "0")


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn :class:`AutotuneError` into one stderr line and exit status 2.

    Any other exception is a bug in autotune: it also gets one line (its type
    and message) and exit status 1, with the traceback under ``--debug``.
    """
    try:
        yield
    except AutotuneError as exc:
        if debug_enabled():
            raise
        err_console.print(f"autotune: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("autotune: interrupted", markup=False)
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        if debug_enabled():
            raise
        err_console.print(
            f"autotune: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None


def print_json(record: BaseModel) -> None:
    """Print a record as JSON on stdout, with nothing else there."""
    sys.stdout.write(record.model_dump_json(indent=2) + "\n")
    sys.stdout.flush()
