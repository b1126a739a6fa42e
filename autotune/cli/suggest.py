"""`autotune suggest`: the policy's ordered changes for a saved profile (never imports torch)."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli import _options
from autotune.cli._common import console, print_json, user_errors
from autotune.records import format_bytes


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("suggest")(suggest_command)


def suggest_command(
    profile: Path = typer.Argument(
        Path("autotune-profile.json"), help="A profile saved by `autotune profile`."
    ),
    device_memory: str | None = _options.DEVICE_MEMORY,
    margin: float = _options.MARGIN,
    nproc_per_node: int = _options.NPROC_PER_NODE,
    nnodes: int = _options.NNODES,
    inter_gbps: float | None = _options.INTER_GBPS,
    global_batch: int | None = typer.Option(
        None,
        "--global-batch",
        min=1,
        help="Target samples per optimizer step, kept with accumulation.",
    ),
    policy: Path | None = typer.Option(
        None,
        "--policy",
        help='A policy TOML file (replaces, or with extends = "default" extends, the default).',
    ),
    framework: str | None = typer.Option(
        None,
        "--framework",
        help="torch|accelerate|deepspeed|hf_trainer; torch and accelerate name the FSDP2 "
        "alternative of a ZeRO stage.",
    ),
    json_output: bool = _options.JSON,
    world_size: int | None = _options.RENAMED_WORLD_SIZE,
    gpus_per_node: int | None = _options.RENAMED_GPUS_PER_NODE,
) -> None:
    """Propose the next change, then the rest of the ordered plan, from a saved profile.

    Exits 1 (after printing) when the final plan cannot keep --global-batch, 2 on bad input.
    """
    with user_errors():
        from autotune.policy import suggest
        from autotune.records import AutotuneError, ProfileRecord, read_record

        _options.refuse_renamed(world_size=world_size, gpus_per_node=gpus_per_node)
        known = ("torch", "accelerate", "deepspeed", "hf_trainer")
        if framework is not None and framework not in known:
            raise AutotuneError(f"--framework: {framework!r} is not one of {', '.join(known)}")
        machine = _options.machine(device_memory=device_memory, margin=margin,
                                   nproc_per_node=nproc_per_node, nnodes=nnodes,
                                   inter_gbps=inter_gbps)  # fmt: skip
        record = suggest(
            read_record(profile, ProfileRecord, "profile"),
            machine=machine,
            global_batch=global_batch,
            policy_path=policy,
            profile_path=str(profile),
            framework=framework,
        )
        if json_output:
            print_json(record)
        else:
            render(record)
        if not record.global_batch_kept:
            raise typer.Exit(1)  # the plan changes --global-batch: a note says why


def render(record: object) -> None:
    """Print the next change first, then the rest of the ordered plan, one block each."""
    from autotune.policy import SuggestRecord

    assert isinstance(record, SuggestRecord)
    console.print(f"baseline plan: {record.baseline.describe()}", soft_wrap=True)
    console.print(f"policy: {record.policy}", soft_wrap=True)
    if not record.suggestions:
        console.print("nothing to suggest: no rule of the policy applies to this profile")
    for index, item in enumerate(record.suggestions, 1):
        title = "next change" if index == 1 else f"then {index}"
        change = ", ".join(f"{knob}={_show(value)}" for knob, value in item.change.items())
        evidence = ", ".join(
            f"{name}={_show(fact.value)} ({fact.source})" for name, fact in item.evidence.items()
        )
        lines = [
            f"[bold]{title}: {item.rule}[/bold]: {change}",
            f"  evidence: {evidence}",
            f"  predicted: {_predicted(item.predicted)}",
            f"  why: {item.reason}",
        ]
        if item.fsdp2_alternative:
            lines.append(
                f"  or with PyTorch's FSDP2: {item.fsdp2_alternative} "
                f"(autotune config --plan '{item.fsdp2_alternative}')"
            )
        console.print("\n".join(lines), soft_wrap=True, markup=True, highlight=False)
    console.print(f"final plan: {record.final_plan.describe()}", soft_wrap=True)
    for note in record.notes:
        console.print(f"note: {note}", soft_wrap=True)


def _predicted(pred: object) -> str:
    from autotune.policy import Predicted

    assert isinstance(pred, Predicted)
    memory = f"peak {format_bytes(pred.peak_bytes_before)} -> {format_bytes(pred.peak_bytes_after)}"
    if pred.fits_after is not None:
        memory += ", fits" if pred.fits_after else ", does not fit"
    memory += f" ({pred.memory_source})"
    if pred.step_time_ratio is None:
        return f"{memory}; step time not predicted"
    # The estimate scales measured phase times: a prediction, though from measured numbers.
    how = "formula on measured times" if pred.time_source == "measured" else pred.time_source
    return f"{memory}; step time x{pred.step_time_ratio:.2f} ({how})"


def _show(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and value >= 2**20:
        return format_bytes(value)
    return str(value)
