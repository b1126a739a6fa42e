"""`autotune profile`: not yet implemented (placeholder registered so the CLI imports)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
