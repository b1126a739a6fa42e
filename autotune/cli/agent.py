"""`autotune agent`: run on every node of a multi-node study; launches this node's ranks of each trial."""

from __future__ import annotations

import typer

from autotune.cli._common import err_console, user_errors


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("agent")(agent_command)


def agent_command(
    storage: str = typer.Option(..., "--storage", envvar="AUTOTUNE_STORAGE", help="The study's database URL, as given to `autotune tune --storage` (or AUTOTUNE_STORAGE, which keeps a password off the command line)."),
    study: str = typer.Option(..., "--study", help="The study's name, as given to `autotune tune --study`."),
    idle_timeout: float = typer.Option(1800.0, "--idle-timeout-s", "--idle-timeout", help="Exit after this many seconds without a trial to run."),
    workdir: str | None = typer.Option(None, "--workdir", help="Where spec and result files go (default: a temporary folder)."),
) -> None:  # fmt: skip
    """Launch this node's ranks of every trial `autotune tune --nnodes K` posts, until it ends.

    Run one agent on each of the K nodes (e.g. `srun --ntasks-per-node=1 autotune agent ...`). The asker (`autotune tune`) puts each trial in the study; every agent reads it, starts torchrun for its --nproc-per-node ranks with the c10d rendezvous at the asker's --rdzv-endpoint, and writes its node's report back to the study.

    The model file must be at the same path on every node, with the same versions of Python, torch, DeepSpeed and autotune (checked for every trial).
    """
    with user_errors():
        from autotune.api import serve_agent

        def say(line: str) -> None:
            err_console.print(f"autotune agent: {line}", markup=False, highlight=False,
                              soft_wrap=True)  # fmt: skip

        served = serve_agent(storage, study, idle_timeout_s=idle_timeout, workdir=workdir, say=say)
        say(f"{served} trial launch(es) run")
