"""What every command shares: the error boundaries (usage errors and user errors as one
line), the debug switch, option checks, output-path checks, tables, JSON output."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer
from typer.core import TyperGroup

from autotune.records import AutotuneError, Terminated, sigterm_unwinds

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


class AutocastChoice(StrEnum):
    """``--autocast`` of profile and estimate: off (fp32), or torch.autocast to a 16-bit type."""

    off = "off"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def precision(self) -> Literal["fp32", "bf16", "fp16"]:
        """The profile record's ``config.precision``: fp32, bf16 or fp16 (autocast's dtype)."""
        return {"off": "fp32", "bf16": "bf16", "fp16": "fp16"}[self.value]  # type: ignore[return-value]


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

    SIGINT exits 130 and SIGTERM 143, each after ``finally`` blocks have run
    (SIGTERM is turned into :class:`Terminated` while inside). Any other
    exception is a bug in autotune: it also gets one line (its type and message)
    and exit status 1, with the traceback under ``--debug``.
    """
    try:
        with sigterm_unwinds():
            yield
    except AutotuneError as exc:
        if debug_enabled():
            raise
        err_console.print(f"autotune: {exc}", markup=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("autotune: interrupted", markup=False)
        raise typer.Exit(130) from None
    except Terminated as exc:
        err_console.print(f"autotune: {exc}", markup=False)
        raise typer.Exit(exc.exit_code) from None
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


def _flag(param: Any) -> str:
    """How a parameter is written: its long option, or an argument's name in capitals."""
    opts = [o for o in getattr(param, "opts", []) or [] if o.startswith("-")]
    if opts:
        return max(opts, key=len)
    return str(getattr(param, "name", "") or "argument").upper()


_PYDANTIC_LIMITS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def _bad_value(cause: BaseException | None, message: str) -> str:
    """The reason a value was refused, from typer's pydantic error where there is one."""
    errors = getattr(cause, "errors", None)
    if not callable(errors):
        return message.rstrip(".")
    first = errors()[0]
    kind, got = first.get("type", ""), first.get("input")
    if kind in _PYDANTIC_LIMITS:
        op, key = _PYDANTIC_LIMITS[kind]
        return f"must be {op} {first['ctx'][key]} (got {got})"
    if kind in ("int_parsing", "int_from_float"):
        return f"must be an integer (got {got!r})"
    if kind == "float_parsing":
        return f"must be a number (got {got!r})"
    text = str(first.get("msg", message)).removeprefix("Value error, ").rstrip(".")
    return text


def usage_line(exc: Exception) -> str:
    """A usage error (typer/click) as one line naming the flag: ``--batch-size: must be >= 1 (got 0)``."""
    name = type(exc).__name__
    param = getattr(exc, "param", None)
    message = str(getattr(exc, "message", "") or exc)
    if name == "MissingParameter" and param is not None:
        return f"{_flag(param)}: required"
    if name == "NoSuchOption":
        option = getattr(exc, "option_name", "")
        near = sorted(getattr(exc, "possibilities", None) or [])
        return f"{option}: no such option" + (f" (did you mean {', '.join(near)}?)" if near else "")
    if param is not None:
        return f"{_flag(param)}: {_bad_value(exc.__cause__, message)}"
    return message.rstrip(".")


class OneLineErrors(TyperGroup):
    """The root command: usage errors print one ``autotune: ...`` line and exit 2 (no Rich box)."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:  # fmt: skip
        """Run the command line; as click's ``main``, with one-line usage errors."""
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, windows_expand_args=windows_expand_args,
                                **extra)  # fmt: skip
        except typer.TyperException as exc:
            if type(exc).__name__ != "NoArgsIsHelpError":  # help was printed already
                err_console.print(f"autotune: {usage_line(exc)}", markup=False, soft_wrap=True)
            code = getattr(exc, "exit_code", 2)
            if not standalone_mode:
                raise
        except typer.Abort:
            err_console.print("autotune: aborted", markup=False)
            code = 1
            if not standalone_mode:
                raise
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


def at_least(low: float) -> Any:
    """An option callback refusing values below ``low`` (``None`` passes: not given)."""

    def check(value: Any) -> Any:
        if value is not None and value < low:
            raise typer.BadParameter(f"must be >= {low:g} (got {value:g})")
        return value

    return check


def above(low: float) -> Any:
    """An option callback refusing values not above ``low`` (``None`` passes: not given)."""

    def check(value: Any) -> Any:
        if value is not None and value <= low:
            raise typer.BadParameter(f"must be > {low:g} (got {value:g})")
        return value

    return check


def device_name(value: str | None) -> str | None:
    """An option callback: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked before torch loads
    (``None`` passes: not given)."""
    import re

    if value is not None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise typer.BadParameter(f"must be auto, cpu, cuda or cuda:N (got {value!r})")
    return value


def check_output(path: Path, flag: str) -> None:
    """Refuse an output path that cannot be written, before any work is done.

    Raises:
        AutotuneError: ``path`` is a directory, its directory is missing, or the
            directory does not accept a new file (read-only, no permission).
    """
    if path.is_dir():
        raise AutotuneError(f"{flag} {path}: is a directory (give a file name)")
    check_directory(path.parent if str(path.parent) else Path("."), f"{flag} {path}")


def check_out_dir(directory: Path, what: str) -> None:
    """Refuse an output directory that could not be written, before any work: one that exists
    must take a new file; a missing one (created when the outputs are written, as training
    tools do) must have a writable nearest existing parent."""
    if directory.exists() and not directory.is_dir():
        raise AutotuneError(f"{what}: {directory} exists and is not a directory")
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise AutotuneError(f"{what}: {existing} is not a directory")
    check_directory(existing, what)


def check_directory(directory: Path, what: str) -> None:
    """Refuse a directory that is missing or does not accept a new file (tried for real)."""
    if not directory.is_dir():
        raise AutotuneError(f"{what}: directory {directory} does not exist")
    try:
        with tempfile.NamedTemporaryFile(prefix=".autotune-probe-", dir=directory):
            pass
    except OSError as exc:
        raise AutotuneError(f"{what}: cannot write in {directory} ({exc.strerror})") from None


def print_table(table: Any) -> None:
    """Print a Rich table so no figure or word is ever cut.

    Rich fits a table to the console (80 columns on a pipe, where there is no
    terminal) and, when wrapping text is not enough, cuts cells with ``…``.
    Here no column gets narrower than its longest word, and a console too narrow
    for that gets the table at that width: text still wraps, numbers stay whole.
    """
    from rich.console import Console
    from rich.measure import Measurement

    real = console.get()
    unbounded = real.options.update_width(10**6)
    for column in table.columns:
        words = [Measurement.get(real, unbounded, cell).minimum
                 for cell in (column.header, *column.cells)]  # fmt: skip
        column.min_width = max([column.min_width or 0, *words])
    least = Measurement.get(real, unbounded, table).minimum
    if least <= real.width:
        real.print(table)
        return
    # Console.print caps its width at the console's, so a wider one prints this table.
    wide = Console(file=real.file, width=least, highlight=False,
                   force_terminal=real.is_terminal, no_color=real.no_color)  # fmt: skip
    wide.print(table, crop=False)


def print_json(record: BaseModel) -> None:
    """Print a record as JSON on stdout, with nothing else there."""
    sys.stdout.write(record.model_dump_json(indent=2) + "\n")
    sys.stdout.flush()
