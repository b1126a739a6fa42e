"""`autotune confirm`: measure the policy's changes one at a time with real A/B steps."""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.cli import _options, _source
from autotune.cli._common import (
    check_output,
    console,
    err_console,
    print_json,
    user_errors,
)
from autotune.records import ConfirmOptions


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("confirm")(confirm_command)


def confirm_command(
    model: Path | None = _source.MODEL,
    batch_size: int = typer.Option(
        ..., "--batch-size", "-b", min=1, help="Micro-batch of the baseline."
    ),
    profile: Path | None = typer.Option(
        ConfirmOptions.profile_path,
        "--profile",
        help="Reuse a saved baseline profile instead of profiling now.",
    ),
    device: str | None = _options.DEVICE,
    steps: int = typer.Option(
        ConfirmOptions.steps, "--steps", min=1, help="Timed steps per arm in each repeat."
    ),
    repeats: int = typer.Option(
        ConfirmOptions.repeats,
        "--repeats",
        min=1,
        help="Interleaved A/B repeats (the interval's sample).",
    ),
    warmup: int = typer.Option(
        ConfirmOptions.warmup, "--warmup", min=0, help="Untimed steps per arm first."
    ),
    loss_tolerance: float = typer.Option(
        ConfirmOptions.loss_tolerance,
        "--loss-tolerance",
        help="Largest relative change of the mean loss accepted.",
    ),
    max_changes: int = typer.Option(
        ConfirmOptions.max_changes,
        "--max-changes",
        min=1,
        help="Most changes tried in one session.",
    ),
    device_memory: str | None = _options.DEVICE_MEMORY,
    margin: float = _options.MARGIN,
    global_batch: int | None = typer.Option(
        ConfirmOptions.global_batch, "--global-batch", min=1, help="Target samples per step."
    ),
    policy: Path | None = typer.Option(
        ConfirmOptions.policy_path, "--policy", help="A policy TOML file."
    ),
    output: Path = typer.Option(
        Path("autotune-confirm.json"), "--output", "-o", help="Where the session log is written."
    ),
    json_output: bool = _options.JSON,
    hf_config: str | None = _source.HF_CONFIG,
    hf_model: str | None = _source.HF_MODEL,
    seq_len: int | None = _source.SEQ_LEN,
    task: str | None = _source.TASK,
) -> None:
    """Profile a baseline, then keep each proposed change only if measured faster (or needed to fit)."""
    with user_errors():
        from autotune.api import confirm
        from autotune.records import ProfileRecord, read_record, write_record

        options = ConfirmOptions(
            batch_size=batch_size,
            steps=steps,
            repeats=repeats,
            warmup=warmup,
            loss_tolerance=loss_tolerance,
            max_changes=max_changes,
            global_batch=global_batch,
            profile_path=str(profile) if profile else None,
            policy_path=str(policy) if policy else None,
        )
        check_output(output, "--output")
        saved = options.profile_path
        record = confirm(
            model,
            batch_size=options.batch_size,
            profile=read_record(saved, ProfileRecord, "profile") if saved else None,
            device=device,
            steps=options.steps,
            repeats=options.repeats,
            warmup=options.warmup,
            loss_tolerance=options.loss_tolerance,
            max_changes=options.max_changes,
            progress=lambda line: err_console.print(line, markup=False, soft_wrap=True),
            machine=_options.machine(device=device, device_memory=device_memory, margin=margin),
            global_batch=options.global_batch,
            policy_path=options.policy_path,
            hf_config=hf_config,
            hf_model=hf_model,
            seq_len=seq_len,
            task=task,
        )
        write_record(output, record)
        if json_output:
            print_json(record)
            return
        render(record)
        console.print(f"session log written to {output}", markup=False, soft_wrap=True)


def render(record: object) -> None:
    """The session, one block per change: proposed, predicted, measured, kept or rejected."""
    from autotune.confirm import ConfirmRecord

    assert isinstance(record, ConfirmRecord)
    console.print(f"baseline: {record.baseline.describe()}", markup=False, soft_wrap=True)
    for index, step in enumerate(record.steps, 1):
        change = ", ".join(f"{knob}={value}" for knob, value in step.change.items())
        pred = step.predicted.step_time_ratio
        lines = [
            f"{index}. {step.rule}: {change}: {step.status.upper()} ({step.why})",
            "   predicted step time: "
            + (
                "not predicted"
                if pred is None
                else f"x{pred:.2f} ({_how(step.predicted.time_source)})"
            ),
        ]
        if step.measured is not None:
            got = step.measured
            low, high = got.ratio_interval
            lines.append(
                f"   measured step time: x{got.step_time_ratio:.2f} [{low:.2f}, {high:.2f}] "
                f"({got.before_step_s * 1000:.1f} -> {got.after_step_s * 1000:.1f} ms, "
                f"{got.repeats} interleaved repeats of {got.steps_per_repeat} steps)"
            )
            delta = "–" if got.loss_delta is None else f"{got.loss_delta:.2%}"
            lines.append(
                f"   loss: {got.loss_before:.4f} -> {got.loss_after:.4f} (relative change {delta})"
            )
        console.print("\n".join(lines), soft_wrap=True, markup=False, highlight=False)
    console.print(f"final plan: {record.final_plan.describe()}", markup=False, soft_wrap=True)
    for note in record.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def _how(source: str | None) -> str:
    # The estimate scales measured phase times: a prediction, though from measured numbers.
    return "formula on measured times" if source == "measured" else str(source)
