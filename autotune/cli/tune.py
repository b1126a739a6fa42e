"""`autotune tune`: Optuna search over real short trials; writes the recommendation and ds_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from autotune.cli import _options, _source
from autotune.cli._common import (
    above,
    check_out_dir,
    console,
    err_console,
    print_json,
    print_table,
    user_errors,
)
from autotune.records import Machine, TuneOptions, format_bytes

_BUDGET_MINUTES = None if TuneOptions.budget_s is None else TuneOptions.budget_s / 60


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("tune")(tune_command)


def tune_command(
    model: Path | None = _source.MODEL,
    global_batch: int = typer.Option(..., "--global-batch", min=1, help="Samples per optimizer step, kept by every plan."),
    nproc_per_node: int = _options.NPROC_PER_NODE,
    nnodes: int = _options.NNODES,
    rdzv_endpoint: str | None = typer.Option(TuneOptions.rdzv_endpoint, "--rdzv-endpoint", help="HOST:PORT of the c10d rendezvous (with --nnodes > 1): a free port on one of the nodes."),
    join_timeout: float = typer.Option(TuneOptions.join_timeout_s, "--join-timeout-s", "--join-timeout", callback=above(0), help="Seconds the nodes of a trial wait for each other; a node that never joins makes the trial a timeout."),
    inter_gbps: float | None = _options.INTER_GBPS,
    trials: int = typer.Option(TuneOptions.trials, "--trials", min=1, help="Plans to measure (pruned plans do not count)."),
    budget_minutes: float | None = typer.Option(_BUDGET_MINUTES, "--budget-minutes", callback=above(0), help="Stop starting trials after this much trial time."),
    trial_timeout: float = typer.Option(TuneOptions.trial_timeout_s, "--trial-timeout-s", "--trial-timeout", callback=above(0), help="Seconds before a trial's process group is killed."),
    device_memory: str | None = _options.DEVICE_MEMORY,
    margin: float = _options.MARGIN,
    storage: str | None = typer.Option(TuneOptions.storage, "--storage", help="Optuna RDB URL or sqlite path (default autotune-tune.db); rerun to resume."),
    heartbeat: int = typer.Option(TuneOptions.heartbeat_s, "--heartbeat-s", "--heartbeat", min=1, help="Seconds between a running trial's heartbeats; a trial silent for 3 (its worker killed, on any host) is failed and run again."),
    study: str | None = typer.Option(TuneOptions.study_name, "--study", help="Study name (default: from the model file or config, global batch and nproc)."),
    steps: int = typer.Option(TuneOptions.steps, "--steps", min=1, help="Fewest measured optimizer steps per trial, unless the measured steps already took 15 s (then 1 or more)."),
    interval: float = typer.Option(TuneOptions.interval_width or 0.0, "--interval", help="Measure until the median step time is known to +-this share (0: exactly --steps)."),
    max_steps: int = typer.Option(TuneOptions.max_steps, "--max-steps", min=1, help="Most measured steps per trial when measuring to --interval."),
    warmup: int = typer.Option(TuneOptions.warmup, "--warmup", min=0, help="Optimizer steps run first in each trial and dropped."),
    repeats: int = typer.Option(TuneOptions.repeats, "--repeats", min=0, help="Most rounds of interleaved re-runs of the plans whose intervals overlap the best's; they stop once the intervals separate (0: none; the search's runs are compared, and the record says so)."),
    device: str | None = _options.DEVICE,
    profile: Path | None = typer.Option(TuneOptions.profile_path, "--profile", help="A saved profile (default: a short fresh one)."),
    baseline: str | None = typer.Option(TuneOptions.baseline, "--baseline", help="Your current plan, e.g. 'mb=8' (default: the per-rank batch in one micro-batch)."),
    policy: Path | None = typer.Option(TuneOptions.policy_path, "--policy", help='A policy TOML file (default: the shipped autotune/policy/default.toml; a file with extends = "default" extends it).'),
    out_dir: Path = typer.Option(Path("."), "--out-dir", help="Where recommendation.json, ds_config.json and autotune-tune.json go (created if missing)."),
    finish: bool = typer.Option(TuneOptions.finish, "--finish", help="Start no trial: read the study's final comparison (run it if no worker still runs trials)."),
    engines: str | None = typer.Option(TuneOptions.engines, "--engines", show_default=False, help="Who may shard a ZeRO stage: deepspeed, fsdp2, or both (default: both for a model file, searched where a trial has several ranks; deepspeed for a script after --)."),
    json_output: bool = _options.JSON,
    hf_config: str | None = _source.HF_CONFIG,
    hf_model: str | None = _source.HF_MODEL,
    seq_len: int | None = _source.SEQ_LEN,
    task: str | None = _source.TASK,
    command: list[str] | None = typer.Argument(None, show_default=False, help="After --: your own launch command (python train.py ..., torchrun ..., accelerate launch ..., deepspeed ...), run unchanged in each trial with the plan injected (instead of MODEL)."),
    arg_map: list[str] = typer.Option([], "--arg-map", help="With -- COMMAND: KEY=--flag, the script flag that takes a DeepSpeed config key's value, e.g. train_micro_batch_size_per_gpu=--batch-size (repeatable)."),
) -> None:  # fmt: skip
    """Search precision, micro-batch, checkpointing, ZeRO stage and engine with real trials; recommend the fastest.

    Roles: this command asks the study (Optuna, in --storage) for plans and records what they measured. With --nnodes 1 it also launches each trial here (torchrun for --nproc-per-node ranks); several copies on one --storage and --study share the study, each running its own trials (on one machine, start each with its own CUDA_VISIBLE_DEVICES or taskset -c CPUS).

    With --nnodes K > 1 it launches nothing: run `autotune agent --storage URL --study NAME` on each of the K nodes; the agents start the ranks of every trial with torchrun, meeting at the c10d rendezvous --rdzv-endpoint HOST:PORT (a free port on one of the nodes).

    A worker or node that dies stops its trial's heartbeats; the trial is failed and run again.
    """
    with user_errors():
        from autotune.api import check_tune, tune_model
        from autotune.records import TuneOptions

        machine = _options.machine(device=device, device_memory=device_memory, margin=margin,
                                   nproc_per_node=nproc_per_node, nnodes=nnodes,
                                   inter_gbps=inter_gbps)  # fmt: skip
        per_rank = max(global_batch // machine.world_size, 1)
        options = TuneOptions(
            global_batch=global_batch, trials=trials,
            budget_s=budget_minutes * 60 if budget_minutes is not None else None,
            trial_timeout_s=trial_timeout, steps=steps, interval_width=interval or None,
            max_steps=max_steps, warmup=warmup, repeats=repeats, storage=storage,
            study_name=study, heartbeat_s=heartbeat,
            profile_path=str(profile) if profile else None,
            policy_path=str(policy) if policy else None,
            baseline=_baseline(baseline, per_rank, machine) if baseline else None,
            engines=_engines(engines) if engines is not None else None, finish=finish, rdzv_endpoint=rdzv_endpoint,
            join_timeout_s=join_timeout,
        )  # fmt: skip
        # After --, the first token lands in MODEL's place: it is the command's.
        script = [str(model), *command] if command and model else None
        if script is None:
            check_tune(options, machine, str(model) if model else None)
        else:
            from autotune.api import check_script

            check_script(script, options, machine, arg_map)
        check_out_dir(out_dir, f"--out-dir {out_dir}")
        with _ProgressView(trials, quiet=not err_console.is_terminal) as view:
            if script is not None:
                from autotune.api import tune_script

                record = tune_script(script, options=options, machine=machine,
                                     arg_map=arg_map, progress=view.update)  # fmt: skip
            else:
                record = tune_model(str(model) if model else None, options=options, machine=machine,
                                hf_config=hf_config, hf_model=hf_model, seq_len=seq_len,
                                task=task, progress=view.update, notice=view.notice)  # fmt: skip
        written = _write_outputs(record, out_dir, machine.world_size)
        if json_output:
            print_json(record)
        else:
            render(record, written)


def _baseline(text: str, per_rank: int, machine: Machine) -> Any:
    """The user's plan; given only a micro-batch, accumulation keeps the global batch."""
    from autotune.records import Plan, parse_plan

    start = Plan(micro_batch=per_rank, nproc_per_node=machine.nproc_per_node, nnodes=machine.nnodes)
    plan = parse_plan(text, start, "--baseline")
    if "ga=" not in text and "grad_accum" not in text and per_rank % plan.micro_batch == 0:
        plan = plan.with_changes(grad_accum=per_rank // plan.micro_batch)
    return plan


def _engines(text: str) -> tuple[str, ...]:
    """``--engines`` split at commas (TuneOptions checks the names)."""
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


TUNE_RECORD = "autotune-tune.json"
"""The tune record's file in --out-dir, which ``autotune report --tune`` reads."""


def _write_outputs(record: Any, out_dir: Path, nproc: int) -> list[Path]:
    """The tune record, and with a recommendation its record and config, in ``out_dir``."""
    from autotune.records import atomic_write_text, write_record

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [write_record(out_dir / TUNE_RECORD, record)]
    rec = record.recommendation
    if rec is None:
        return written
    from autotune.api import deepspeed_config

    if rec.plan.engine == "fsdp2":  # its deliverable: the Accelerate config file
        from autotune.cli.config import fsdp2_for_stack
        from autotune.emit import accelerate_fsdp_yaml

        out = fsdp2_for_stack(rec, nproc, record.block_stack)
        return [
            *written,
            write_record(out_dir / "recommendation.json", rec),
            atomic_write_text(out_dir / "accelerate_fsdp2.yaml",
                              accelerate_fsdp_yaml(out["accelerate_config"])),
        ]  # fmt: skip

    config = deepspeed_config(rec, world_size=nproc)
    return [
        *written,
        write_record(out_dir / "recommendation.json", rec),
        atomic_write_text(out_dir / "ds_config.json", json.dumps(config, indent=2) + "\n"),
    ]


class _ProgressView:
    """Progress on stderr: on a terminal a Rich bar (trial i of T, the best so far, the time
    left); elsewhere (a log under nohup, Slurm or CI) one plain line per trial."""

    def __init__(self, total: int, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.lines = quiet
        self.progress = Progress(
            TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
            console=err_console.get(), disable=quiet, transient=False,
        )  # fmt: skip
        self.task = self.progress.add_task("starting (profile, warm-up launch)", total=total)

    def __enter__(self) -> _ProgressView:
        self.progress.start()
        return self

    def notice(self, line: str) -> None:
        """A start-up line: in the log as it comes, on a terminal as the bar's text."""
        self.progress.update(self.task, description=line)
        if self.lines:
            self._say(line)

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None:  # the error line says what happened; the bar goes
            self.progress.live.transient = True
        self.progress.stop()

    def update(self, state: Any) -> None:
        best = state.best
        shown = f"best {_throughput(best)} ({best.plan.describe()})" if best else "best: none yet"
        left = f", {state.seconds_left / 60:.1f} min left" if state.seconds_left is not None else ""
        last = f"last: {state.last.plan.describe()} {state.last.outcome or 'pruned'}"
        self.progress.update(self.task, completed=min(state.measured, state.target),
                             description=f"{shown}{left}; {last}")  # fmt: skip
        if self.lines:
            self._say(_trial_line(state))

    @staticmethod
    def _say(line: str) -> None:
        err_console.print(f"autotune tune: {line}", markup=False, highlight=False, soft_wrap=True)


def _trial_line(state: Any) -> str:
    """One trial's line for a log: what ran, its outcome and figures, the best, the time left."""
    t = state.last
    figures = [_throughput(t)] if t.samples_per_s is not None else []
    if t.peak_memory_bytes:
        figures.append(f"peak {format_bytes(t.peak_memory_bytes)}")
    if t.duration_s is not None:
        figures.append(f"{t.duration_s:.1f} s")
    outcome = t.outcome or "pruned"
    why = f" ({t.reason})" if t.reason and outcome != "ok" else ""
    best = (
        f"best {_throughput(state.best)} ({state.best.plan.describe()})"
        if state.best
        else "no best yet"
    )
    left = (
        f"; {state.seconds_left / 60:.1f} min of budget left"
        if state.seconds_left is not None
        else ""
    )
    return (f"trial {t.number} [{state.measured}/{state.target}] {t.plan.describe()}: {outcome}{why}"
            f"{': ' + ', '.join(figures) if figures else ''}; {best}{left}")  # fmt: skip


def _costs(record: Any) -> str:
    """A trial's fixed cost (request to first step; ``*``: a reused worker) and its steps."""
    if record.fixed_s is None and record.steps_s is None:
        return "–"
    fixed = f"{record.fixed_s:.1f}" if record.fixed_s is not None else "–"
    mark = "*" if record.reused_worker else ""
    steps = f"{record.steps_s:.1f}" if record.steps_s is not None else "–"
    count = f" ({record.steps_measured})" if record.steps_measured else ""
    return f"{fixed}{mark} / {steps}{count}"


def _throughput(record: Any) -> str:
    if record is None or record.samples_per_s is None:
        return "–"
    if record.tokens_per_s is not None:
        return f"{record.tokens_per_s:,.0f} tok/s"
    return f"{record.samples_per_s:,.2f} samples/s"


def render(record: Any, written: list[Path]) -> None:
    """The trial table, then the recommendation next to the baseline."""
    from rich.table import Table

    table = Table(title=f"study {record.study} ({record.storage})")
    for column in ("#", "role", "plan", "state", "outcome", "throughput", "peak (measured)",
                   "peak (predicted)", "start-up / steps s", "reason"):  # fmt: skip
        # Figures never wrap (print_table widens the table rather than cut them).
        table.add_column(column, no_wrap=column in ("#", "throughput"))
    for t in record.trials:
        predicted = (
            f"{format_bytes(t.predicted_peak_bytes)} ({t.prediction_source})"
            if t.predicted_peak_bytes
            else "–"
        )
        measured = (
            f"{format_bytes(t.peak_memory_bytes)} ({t.peak_source})" if t.peak_memory_bytes else "–"
        )
        table.add_row(str(t.number), t.role, t.plan.describe(), t.state, t.outcome or "–",
                      _throughput(t), measured, predicted, _costs(t), t.reason or "")  # fmt: skip
    print_table(table)
    _render_recommendation(record)
    for path in written:
        console.print(f"wrote {path}", markup=False, soft_wrap=True)
    for note in record.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if record.wall_time is not None:
        console.print(f"wall time: {record.wall_time.describe()}", markup=False, soft_wrap=True)


def _how_measured(comparison: Any, index: int) -> str:
    """Where an entry's figures come from: the search's run, and any re-runs."""
    if comparison.reruns is None:  # an older record: every entry re-run alike
        return (f"measured, median of {comparison.measured[index].repeats}" if comparison.repeats
                else "one search run, not re-run: --repeats 0")  # fmt: skip
    rerun = comparison.reruns[index]
    if rerun:
        return f"median of the search run and {rerun} re-run(s)"
    return "the search run, not re-run" + (": --repeats 0" if comparison.cap == 0 else "")


def _render_recommendation(record: Any) -> None:
    rec = record.recommendation
    if rec is None:
        console.print("no recommendation from this run (the notes say why)")
        return
    comparison = record.comparison
    for index, (label, measured) in enumerate(
        zip(comparison.labels, comparison.measured, strict=True)
    ):
        interval = measured.samples_per_s_interval
        spread = f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""
        tokens = f", {measured.tokens_per_s:,.0f} tok/s" if measured.tokens_per_s else ""
        mark = "*" if index == comparison.winner else " "
        how = _how_measured(comparison, index)
        console.print(f"{mark} {label}: {measured.plan.describe()}: {measured.samples_per_s:.2f} samples/s"
                      f"{spread}{tokens}, peak {format_bytes(measured.peak_memory_bytes)} "
                      f"({how})", markup=False, soft_wrap=True)  # fmt: skip
    if rec.speedup is not None and rec.speedup_interval is not None:
        low, high = rec.speedup_interval
        console.print(
            f"speedup over the baseline: {rec.speedup:.2f}x [{low:.2f}, {high:.2f}] (measured)",
            markup=False,
        )
    console.print(f"recommended plan (*): {rec.plan.describe()}", markup=False, soft_wrap=True)
