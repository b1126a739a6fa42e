"""`autotune report`: one self-contained HTML page (and PNGs) from profile, suggestions and trials."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli import _options
from autotune.cli._common import check_output, err_console, print_json, user_errors


def report(
    profile: Path | None = typer.Argument(None, help="profile.json from `autotune profile`."),
    suggestions: Path | None = typer.Option(
        None, "--suggestions", help="Suggest record from `autotune suggest --json`."
    ),
    confirm: Path | None = typer.Option(
        None, "--confirm", help="Session log of `autotune confirm` (measured effect, kept or not)."
    ),
    tune: Path | None = typer.Option(
        None,
        "--tune",
        help="Tune record: autotune-tune.json, written by `autotune tune` in its --out-dir.",
    ),
    study: str | None = typer.Option(None, "--study", help="Optuna study name (with --storage)."),
    storage: str | None = typer.Option(
        None, "--storage", help="Optuna storage: sqlite:///tune.db or a journal file path."
    ),
    recommendation: Path | None = typer.Option(
        None, "--recommendation", help="Recommendation record."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="HTML file to write (atomically)."),
    png_dir: Path | None = typer.Option(
        None, "--png-dir", help="Also write each figure as a PNG here."
    ),
    device_memory: str | None = _options.DEVICE_MEMORY,
    as_json: bool = _options.JSON,
) -> None:
    """Write an HTML report: memory breakdown, activations, step split, trials, importances."""
    with user_errors():
        from autotune.records import parse_bytes
        from autotune.report import build_report, load_inputs, write_report

        check_output(out, "--out")

        budget = parse_bytes(device_memory, "--device-memory") if device_memory else None
        inputs = load_inputs(
            profile=profile,
            suggestions=suggestions,
            confirm=confirm,
            tune=tune,
            study=study,
            storage=storage,
            recommendation=recommendation,
            device_memory=budget,
        )
        record = write_report(build_report(inputs), out, png_dir)
        if as_json:
            print_json(record)
            return
        for note in record.notes:
            err_console.print(f"note: {note}", markup=False, soft_wrap=True)
        shown = ", ".join(record.figures) or "no figures"
        typer.echo(f"wrote {record.out} ({shown})")
        for path in record.png_files:
            typer.echo(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("report")(report)
