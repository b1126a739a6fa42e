"""The ``autotune`` command line: one module per command, joined here.

Nothing here imports torch: ``autotune --help`` and ``--version`` stay fast.
"""

from __future__ import annotations

import os

import typer

from autotune import __version__
from autotune.cli import agent as _agent
from autotune.cli import config as _config
from autotune.cli import confirm as _confirm
from autotune.cli import estimate as _estimate
from autotune.cli import profile as _profile
from autotune.cli import report as _report
from autotune.cli import suggest as _suggest
from autotune.cli import tune as _tune
from autotune.cli._common import OneLineErrors

app = typer.Typer(
    name="autotune",
    cls=OneLineErrors,
    help="Measure a PyTorch training step, predict plans, suggest the next change, confirm it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
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


for _module in (_profile, _estimate, _suggest, _confirm, _config, _tune, _agent, _report):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
