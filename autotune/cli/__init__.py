"""The ``autotune`` command line: one module per command, joined here.

Nothing here imports torch: ``autotune --help`` and ``--version`` stay fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer

from autotune import __version__

COMMANDS = ("profile", "estimate", "suggest", "confirm", "config", "tune", "agent", "report")
"""Each command lives in ``autotune/cli/<name>.py`` and registers itself with ``register(app)``."""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show tracebacks instead of one-line errors."
    ),
) -> None:
    if debug:
        os.environ["AUTOTUNE_DEBUG"] = "1"


def build_app(commands: tuple[str, ...] = COMMANDS) -> typer.Typer:
    """The root app with ``commands`` registered (each command module is imported only here)."""
    from autotune.cli._common import OneLineErrors

    root = typer.Typer(
        name="autotune",
        cls=OneLineErrors,
        help="Measure a PyTorch training step, predict every plan's memory and time, suggest the next change, confirm it, tune with real trials.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    root.callback()(_root)
    for name in commands:
        importlib.import_module(f"autotune.cli.{name}").register(root)
    return root


def __getattr__(name: str) -> Any:
    """``app``: the root app with every command (built on first use)."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point: imports only the command being run.

    ``autotune suggest`` must answer at once, so the other commands' modules are not
    imported for it; ``--help``, options before the command and typos get the full app.
    """
    # pydantic scans every installed distribution's entry points for plugins on the first
    # validation (tens of ms beside torch's stack); the CLI's records use none.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    name = sys.argv[1] if len(sys.argv) > 1 else None
    build_app((name,) if name in COMMANDS else COMMANDS)()
