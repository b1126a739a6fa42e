"""`autotune profile`: measure what each part of a training step costs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotune.cli import _options, _source
from autotune.cli._common import (
    AutocastChoice,
    Switch,
    check_output,
    console,
    err_console,
    print_json,
    print_table,
    user_errors,
)
from autotune.records import ProfileOptions, format_bytes, format_count, format_flops

if TYPE_CHECKING:
    from rich.table import Table

    from autotune.records import ProfileRecord


def profile_command(
    model: Path | None = _source.MODEL,
    batch_size: int = typer.Option(..., "--batch-size", "-b", min=1, help="Samples per step."),
    steps: int = typer.Option(ProfileOptions.steps, "--steps", min=1, help="Timed steps (medians reported)."),
    warmup: int = typer.Option(ProfileOptions.warmup, "--warmup", min=0, help="Steps run first and dropped."),
    device: str | None = _options.DEVICE,
    autocast: AutocastChoice | None = _options.AUTOCAST,
    checkpointing: Switch = typer.Option(Switch.on if ProfileOptions.checkpointing else Switch.off, "--checkpointing", help="Checkpoint every block of the block stack."),
    out: Path = typer.Option(
        Path("autotune-profile.json"), "--out", "-o", help="Where the JSON record is written."
    ),
    as_json: bool = _options.JSON,
    precision: str | None = _options.RENAMED_PRECISION,
    hf_config: str | None = _source.HF_CONFIG,
    hf_model: str | None = _source.HF_MODEL,
    seq_len: int | None = _source.SEQ_LEN,
    task: str | None = _source.TASK,
    launch: list[str] | None = typer.Argument(None, show_default=False, help="After --: your own launch command (python train.py ..., torchrun ...): the model it builds is profiled on its first batch, in its process (instead of MODEL)."),
    arg_map: list[str] = typer.Option([], "--arg-map", help="With -- COMMAND: KEY=--flag, the script flag that takes a DeepSpeed config key's value, e.g. train_micro_batch_size_per_gpu=--batch-size."),
) -> None:  # fmt: skip
    """Run real training steps of MODEL and measure memory, time, FLOPs and the device."""
    with user_errors():
        _options.refuse_renamed(precision=precision)
        options = ProfileOptions(batch_size=batch_size, steps=steps, warmup=warmup,
                                 device=device or ProfileOptions.device,
                                 autocast=autocast.value if autocast else ProfileOptions.autocast,
                                 checkpointing=checkpointing is Switch.on)  # fmt: skip
    if launch and model:  # after --, the first token lands in MODEL's place: it is the command's
        with user_errors():
            check_output(out, "--out")
            from autotune.api import profile_script
            from autotune.records import write_record

            record = profile_script([str(model), *launch], batch_size=options.batch_size,
                                    steps=options.steps, warmup=options.warmup,
                                    device=options.device, arg_map=arg_map)  # fmt: skip
            write_record(out, record)
            if as_json:
                print_json(record)
            else:
                print_table(render(record))
                console.print(f"record written to {out}", style="dim", markup=False, soft_wrap=True)
        return
    with user_errors(), _source.model_source(model, hf_config, hf_model, seq_len, task) as source:
        check_output(out, "--out")
        from autotune.compose import profile_model

        # Rebuilt from the parsed options (all of them, defaults included), so two
        # records say exactly how they differ however the command was typed.
        command = shlex.join(
            ["autotune", "profile", *_source.source_args(model, hf_config, hf_model, seq_len, task)]
            + ["--batch-size", str(options.batch_size)]
            + ["--steps", str(options.steps), "--warmup", str(options.warmup)]
            + ["--device", options.device, "--autocast", options.autocast]
            + ["--checkpointing", "on" if options.checkpointing else "off"]
            + ["--out", str(out)]
            + (["--json"] if as_json else [])
        )
        with _progress() as progress:
            record = profile_model(
                source.path,
                batch_size=options.batch_size,
                steps=options.steps,
                warmup=options.warmup,
                device=options.device,
                precision=AutocastChoice(options.autocast).precision,
                checkpointing=options.checkpointing,
                progress=progress,
                command=command,
                label=source.label,
                second=True,
            )
        from autotune.records import write_record

        write_record(out, record)
        if as_json:
            print_json(record)
        else:
            print_table(render(record))
            console.print(f"record written to {out}", style="dim", markup=False, soft_wrap=True)


class _progress:  # noqa: N801 - used as a context manager, reads like a function
    """A Rich progress bar on stderr, fed by the profiler's ``(phase, done, total)`` calls."""

    def __enter__(self) -> _progress:
        from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err_console.get(),
            transient=True,
            disable=not err_console.is_terminal,  # a bar is noise in a log
        )
        self._tasks: dict[str, TaskID] = {}
        self._bar.__enter__()
        return self

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self._tasks:
            self._tasks[phase] = self._bar.add_task(phase, total=max(total, 1))
        self._bar.update(self._tasks[phase], completed=done, total=max(total, 1))

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)


def _bf16_speed(ratio: float | None) -> str:
    """The measured bf16:fp32 matmul speed ratio said as what it is (a speed, not a time)."""
    if ratio is None:
        return "bf16 matmuls not timed"
    shown = f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.2g}"  # an AVX2-only CPU: 0.011
    return f"bf16 matmuls at {shown}x fp32's speed"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "–"


def render(record: ProfileRecord) -> Table:
    """The record as a table for people: every figure says measured or how it was derived;
    one outside its physical bounds says flagged, and why."""
    from rich.table import Table

    from autotune.estimator import BF16_RATIO_FIGURE, SPREAD_FIGURE, flagged_figures

    cfg, mem, time = record.config, record.memory, record.time
    title = (
        f"{Path(record.provenance.model_file).name}: batch {cfg.batch_size}, {cfg.precision}, "
        f"checkpointing {'on' if cfg.checkpointing else 'off'}, {cfg.device}"
    )
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("note")
    stack = record.model.block_stack
    table.add_row(
        "parameters",
        format_count(record.model.parameters),
        f"trainable {format_count(record.model.trainable_parameters)}"
        + (
            f"; stack {stack.path} x{stack.count} ({stack.block_class})"
            if stack
            else "; no block stack"
        ),
    )
    for name, value in (
        ("memory: parameters", mem.parameters),
        ("memory: gradients", mem.gradients),
        ("memory: optimizer states", mem.optimizer_states),
        ("memory: activations", mem.activations),
        ("memory: autocast weight copies", mem.autocast_weight_copies),
    ):
        table.add_row(name, format_bytes(value), "measured")
    at_peak = ", ".join(
        f"{key} {format_bytes(value)}" for key, value in mem.at_peak.model_dump().items() if value
    )
    table.add_row(
        "memory: peak", format_bytes(mem.peak), f"measured ({mem.peak_source}); {at_peak}"
    )
    table.add_row("process RSS", format_bytes(mem.process_rss), "measured")
    step = time.step
    timings: tuple[tuple[str, float], ...] = (
        ("time: data wait", time.dataloader),
        ("time: forward", time.forward),
        ("time: backward", time.backward),
        ("time: optimizer", time.optimizer),
    )
    for label, seconds in timings:
        table.add_row(label, f"{seconds * 1e3:.2f} ms", f"median, {_share(seconds, step)} of step")
    spread = time.spread
    flags = flagged_figures(record)
    table.add_row(
        "time: step",
        f"{step * 1e3:.2f} ms",
        f"median of {time.steps_measured}; p25-p75 {spread.p25 * 1e3:.2f}-{spread.p75 * 1e3:.2f} ms"
        + _flag(flags, SPREAD_FIGURE, "; "),
    )
    if record.second is not None:
        again = record.second
        table.add_row(
            f"time: step at batch {again.config.batch_size}",
            f"{again.time.step * 1e3:.2f} ms",
            f"median of {again.time.steps_measured}, after the profile on its model: every "
            "estimate from this record splits each phase into a part per micro-batch and a part "
            "per sample",
        )
    tput = record.throughput
    tokens = f", {tput.tokens_per_s:,.0f} tokens/s" if tput.tokens_per_s else ""
    table.add_row("throughput", f"{tput.samples_per_s:,.1f} samples/s", f"measured{tokens}")
    _compute_rows(table, record, flags)
    caps = record.environment.capabilities
    env = record.environment
    table.add_row(
        "device",
        env.device_name,
        f"bf16 {'yes' if caps.bf16_supported else 'no'}, "
        f"{_bf16_speed(caps.bf16_fp32_speed_ratio)} "
        f"({_flag(flags, BF16_RATIO_FIGURE) or 'measured'}), "
        f"flash-attn {'yes' if caps.flash_attn_available else 'no'}",
    )
    return table


def _flag(flags: dict[str, str], figure: str, before: str = "") -> str:
    """``figure``'s flag as text (``flagged, impossible: ...``), or "" when it has none."""
    return f"{before}flagged, {flags[figure]}" if figure in flags else ""


def _compute_rows(table: Table, record: ProfileRecord, flags: dict[str, str]) -> None:
    from autotune.estimator import HFU_FIGURE, MFU_FIGURE

    compute = record.compute
    table.add_row(
        "compute: FLOPs/step",
        format_count(compute.flops_per_step),
        "counted (FlopCounterMode), model FLOPs",
    )
    source = {"table": "datasheet", "measured_matmul": "measured matmul"}.get(
        compute.peak_source or "", "unknown"
    )
    mfu = f"{100 * compute.mfu:.1f}%" if compute.mfu is not None else "–"
    hfu = f"{100 * compute.hfu:.1f}%" if compute.hfu is not None else "–"
    table.add_row(
        "compute: MFU",
        mfu + (" (flagged)" if MFU_FIGURE in flags else ""),
        f"vs peak {format_flops(compute.peak_flops_per_s)} ({source}); HFU {hfu}"
        + _flag(flags, HFU_FIGURE, "; ")
        + _flag(flags, MFU_FIGURE, "; "),
    )


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("profile")(profile_command)
