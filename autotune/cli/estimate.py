"""`autotune estimate`: predict memory, fit, step time and communication of plans before running them."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autotune.cli import _options, _source
from autotune.cli._common import (
    AutocastChoice,
    Switch,
    above,
    console,
    err_console,
    print_json,
    print_table,
    user_errors,
)
from autotune.records import AutotuneError, format_count, format_given_bytes, parse_count

if TYPE_CHECKING:
    from rich.table import Table

    from autotune.compose import Composition
    from autotune.estimator import ClaimCheck, EstimateRecord, ModelFacts, PlanEstimate
    from autotune.records import Machine, Plan, ProfileRecord


def estimate_command(
    model: Path | None = typer.Argument(
        None, help="The model file (omit with --hf-config or --profile)."
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", "-b", min=1, help="Micro-batch per device."
    ),
    seq_len: int | None = typer.Option(
        None, "--seq-len", min=1, help="Tokens per sample (--hf-config)."
    ),
    hf_config: Path | None = typer.Option(
        None,
        "--hf-config",
        help="Instead of MODEL: a transformers config.json, model directory or Hub name (the "
        "config alone is fetched, no weights); traced on fake tensors (with --seq-len).",
    ),
    task: str | None = _source.CONFIG_TASK,
    profiles: list[Path] = typer.Option(
        [],
        "--profile",
        help="A profile record: measured figures. Repeat with profiles that differ in batch "
        "size or checkpointing only, to fit fixed vs per-sample time and the recompute cost.",
    ),
    autocast: AutocastChoice | None = _options.AUTOCAST,
    checkpointing: Switch | None = typer.Option(
        None, "--checkpointing", help="As autotune profile."
    ),
    nproc_per_node: int = _options.NPROC_PER_NODE,
    nnodes: int = _options.NNODES,
    device_memory: str | None = _options.DEVICE_MEMORY,
    margin: float = _options.MARGIN,
    intra_gbps: float | None = typer.Option(
        None, "--intra-gbps", callback=above(0), help="Gbit/s in a node."
    ),
    inter_gbps: float | None = _options.INTER_GBPS,
    link: Path | None = _options.LINK,
    pcie_gbps: float | None = _options.PCIE_GBPS,
    host_memory: str | None = _options.HOST_MEMORY,
    plan: list[str] = typer.Option(
        [], "--plan", help="Knobs, e.g. stage=2,mb=4,ckpt=12 or ckpt=all (repeatable)."
    ),
    all_plans: bool = typer.Option(
        False,
        "--all-plans",
        help="A grid of precision x stage x ckpt x mb, best first: the plans that fit by "
        "predicted throughput, then the rest.",
    ),
    top: int | None = typer.Option(
        None, "--top", min=1, help="Show only the first N rows of the table (the JSON keeps all)."
    ),
    train_tokens: str | None = typer.Option(
        None,
        "--train-tokens",
        help="Token budget, e.g. 300B (B: billions here; in sizes B is bytes).",
    ),
    mfu: float | None = typer.Option(
        None, "--mfu", max=1.0, callback=above(0), help="Assumed MFU for days."
    ),
    peak_tflops: float | None = typer.Option(
        None, "--peak-tflops", callback=above(0), help="Device peak."
    ),
    check: list[str] = typer.Option(
        [],
        "--check",
        help='A table row to check, e.g. "stage=3,world_size=8,memory=3GB" or '
        '"ckpt=all,tokens_per_s=2150,tflops=185.2,device=A100" (repeatable).',
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        help="Where the plans run: auto (this machine's GPU, else its CPU), cpu, cuda; "
        "default: the profiled device with --profile, else auto.",
    ),
    as_json: bool = _options.JSON,
    world_size: int | None = _options.RENAMED_WORLD_SIZE,
    renamed_gpus_per_node: int | None = _options.RENAMED_GPUS_PER_NODE,
    renamed_nodes: int | None = _options.RENAMED_NODES,
    precision: str | None = _options.RENAMED_PRECISION,
) -> None:
    """Predict per-device memory, fit, seconds per step and communication of plans.

    Without --plan or --all-plans: the plan `autotune profile` runs with the same
    options. Activation figures come from --profile (measured) or a trace of MODEL
    or --hf-config on fake tensors (no memory allocated, no weights downloaded).
    """
    with user_errors():
        from autotune.cli._check import read_check

        _options.refuse_renamed(world_size=world_size, gpus_per_node=renamed_gpus_per_node, nodes=renamed_nodes,
                                precision=precision)  # fmt: skip
        machine = _options.machine(device_memory=device_memory, margin=margin,
                                   nproc_per_node=nproc_per_node, nnodes=nnodes,
                                   inter_gbps=inter_gbps, intra_gbps=intra_gbps,
                                   device=device or "auto", pcie_gbps=pcie_gbps,
                                   host_memory=host_memory, link=link)  # fmt: skip
        checks = [read_check(text) for text in check]
        profile = profiles[0] if profiles else None
        base, ckpt_all = _base_plan(batch_size, autocast, checkpointing, profile)
        base = base.with_changes(nproc_per_node=machine.nproc_per_node, nnodes=machine.nnodes)
        composition = _composition(
            model, hf_config, profiles, seq_len, _needed_precisions(base, plan, all_plans), task,
            machine, device or "auto", base.micro_batch,
        )  # fmt: skip
        facts, machine = composition.facts, composition.machine
        if ckpt_all:
            base = base.with_changes(checkpoint_blocks=facts.num_layers)
        from autotune.estimator import estimate

        record = estimate(
            facts,
            _plans(facts, base, plan, all_plans),
            reference=base,
            machine=machine,
            train_tokens=parse_count(train_tokens, "--train-tokens") if train_tokens else None,
            mfu=mfu,
            peak_flops=peak_tflops * 1e12 if peak_tflops else None,
            claims=[
                spec.claim(base, facts.num_layers, peak_tflops * 1e12 if peak_tflops else None)
                for spec in checks
            ],
        )
        if as_json:
            print_json(record)
        else:
            print_table(render(record, ranked_rows=all_plans, top=top))
            for line in _footer(record, ranked_rows=all_plans, top=top):
                console.print(line, markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("estimate")(estimate_command)


def _base_plan(
    batch_size: int | None,
    autocast: AutocastChoice | None,
    checkpointing: Switch | None,
    profile: Path | None,
) -> tuple[Plan, bool]:
    """The plan ``autotune profile`` runs with these options (the profile's own with --profile),
    and whether every block is checkpointed (L is known only once the model is).
    """
    from autotune.records import AUTOCAST_PLAN_PRECISION, Plan

    values: dict[str, object] = {"precision": "fp32", "micro_batch": 1}
    ckpt_all = False
    if profile is not None:
        cfg = _read_profile(profile).config
        values.update(precision=AUTOCAST_PLAN_PRECISION[cfg.precision], micro_batch=cfg.batch_size)
        ckpt_all = cfg.checkpointing
    elif batch_size is None:
        raise AutotuneError("--batch-size: required (or give --profile)")
    if batch_size is not None:
        values["micro_batch"] = batch_size
    if autocast is not None:
        values["precision"] = AUTOCAST_PLAN_PRECISION[autocast.precision]
    if checkpointing is not None:
        ckpt_all = checkpointing is Switch.on
    return Plan.model_validate(values), ckpt_all


def _read_profile(path: Path) -> ProfileRecord:
    from autotune.records import ProfileRecord, read_record

    return read_record(path, ProfileRecord, "profile")


def _needed_precisions(base: Plan, plans: list[str], all_plans: bool) -> tuple[str, ...]:
    """Precisions whose activations must be traced: the base plan's, each --plan's, the grid's."""
    from autotune.records import parse_plan

    needed = {base.precision}
    for text in plans:
        needed.add(parse_plan(text, base, blocks="later").precision)
    if all_plans:
        needed.update(("fp32", "amp_bf16", "bf16"))
    return tuple(sorted(needed))


def _composition(
    model: Path | None,
    hf_config: Path | None,
    profiles: list[Path],
    seq_len: int | None,
    precisions: tuple[str, ...],
    task: str | None,
    machine: Machine,
    device: str,
    batch: int,
) -> Composition:
    """The composer's facts and budget: measured from --profile (with the precisions it lacks
    traced from MODEL, or from the file it ran where unchanged), else traced from MODEL /
    --hf-config (from micro-batch ``batch``, --batch-size); without --device-memory, the default device's (the profiled GPU's or this
    machine's: a GPU's memory, else the available RAM)."""
    from autotune import compose

    if model is not None and hf_config is not None:
        raise AutotuneError("MODEL and --hf-config: give one of them")
    if seq_len is not None and hf_config is None:
        raise AutotuneError("--seq-len: only with --hf-config (a model file makes its own batches)")
    if hf_config is not None and seq_len is None:
        raise AutotuneError("--hf-config needs --seq-len (tokens per sample)")
    if profiles:
        first, *more = [_read_profile(path) for path in profiles]
        with err_console.status("tracing the precisions the profile lacks on fake tensors ..."):
            first = compose.completed(first, model)
        try:
            return compose.compose(first, machine=machine, more_profiles=more)
        except ValueError as exc:
            raise AutotuneError(f"--profile: {exc} (than {profiles[0]})") from None
    if hf_config is not None:
        from autotune.runtime.trace_cache import entry

        assert seq_len is not None
        cached = entry(hf_config, seq_len, precisions, task)
        with (
            err_console.status(f"tracing {hf_config} on fake tensors ...")
            if cached is None or not cached.is_file()
            else contextlib.nullcontext()
        ):
            traced, hit = compose.hf_config_facts(hf_config, seq_len, precisions, task, device)
        if hit:
            typer.echo(f"traced facts of {hf_config} from {cached}", err=True)
        return compose.compose_facts(traced, machine=compose.default_budget(machine, device))
    if model is None:
        raise AutotuneError("MODEL: give a model file, --hf-config or --profile")
    with err_console.status(f"tracing {model} on fake tensors ..."):
        facts = compose.model_file_facts(model, precisions, device, batch)
    return compose.compose_facts(facts, machine=compose.default_budget(machine, device))


def _plans(facts: ModelFacts, base: Plan, plans: list[str], all_plans: bool) -> list[Plan]:
    from autotune.estimator import plan_grid
    from autotune.records import parse_plan

    if all_plans and plans:
        raise AutotuneError("--plan and --all-plans: give one of them")
    if all_plans:
        return plan_grid(facts, base)
    if not plans:
        return [base]
    return [parse_plan(text, base, blocks=facts.num_layers) for text in plans]


def _unit(record: EstimateRecord) -> tuple[str, float]:
    """One unit for the whole table: MiB for small models, GiB otherwise."""
    largest = max(est.memory.peak for est in record.plans)
    return ("MiB", 2.0**20) if largest < 2**30 else ("GiB", 2.0**30)


def _devices(record: EstimateRecord) -> str:
    plan = record.plans[0].plan
    return (
        f"{plan.nproc_per_node} x {plan.nnodes} devices"
        if plan.nnodes > 1
        else f"{plan.world_size} device{'s' if plan.world_size > 1 else ''}"
    )


def _short(plan: Plan) -> str:
    """The plan's knobs without the devices (the title gives them), precision first and bare."""
    parts = plan.describe().split(",")
    skip = ("nproc_per_node=", "nnodes=", "precision=", "stage=0")
    keep = [p for p in parts if not p.startswith(skip)]
    return " ".join([plan.precision, *keep])


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}"


def _reference(record: EstimateRecord) -> Plan:
    return record.baseline or record.plans[0].plan


def relative_throughput(est: PlanEstimate, reference: Plan) -> float | None:
    """Predicted samples per second over the reference plan's: samples per step / step time."""
    ratio = est.predicted_step_time_ratio
    if ratio is None or ratio <= 0:
        return None
    plan = est.plan
    samples = plan.micro_batch * plan.grad_accum * plan.world_size
    return samples / (reference.micro_batch * reference.grad_accum * reference.world_size) / ratio


def ranked(record: EstimateRecord) -> list[PlanEstimate]:
    """The plans that fit (or, with no budget, all) by predicted throughput, highest first,
    then those that do not fit, each group with unknown throughput last."""
    reference = _reference(record)

    def key(est: PlanEstimate) -> tuple[bool, bool, float]:
        speed = relative_throughput(est, reference)
        return est.fits is False, speed is None, -(speed or 0.0)

    return sorted(record.plans, key=key)


def _best(rows: list[PlanEstimate], reference: Plan) -> PlanEstimate | None:
    """The fastest plan predicted to fit; none where fit was not judged (no budget known)."""
    first = rows[0] if rows else None
    if first is None or first.fits is not True or relative_throughput(first, reference) is None:
        return None
    return first


_BUDGET_SOURCES = {
    "device": " (the GPU's)",
    "available_ram": " (this machine's available memory)",
}


def render(record: EstimateRecord, *, ranked_rows: bool = False, top: int | None = None) -> Table:
    """The plans as a table: memory per device by category, fit, time, throughput, communication.

    Args:
        record: the estimate.
        ranked_rows: order the rows by :func:`ranked` and mark the best plan (``--all-plans``).
        top: show only the first ``top`` rows.
    """
    from rich.table import Table

    unit, scale = _unit(record)
    budget = (
        format_given_bytes(record.device_memory_bytes)
        + _BUDGET_SOURCES.get(record.budget_source or "", "")
        if record.device_memory_bytes
        else "no budget"
    )
    title = (
        f"{record.model}: {format_count(record.parameters)} parameters, L={record.num_layers}, "
        f"{_devices(record)}, device memory {budget} (margin {record.margin:.0%}); every size in "
        f"{unit}: per device, host RAM per node, bytes communicated per step (comm s: their "
        "seconds on the link)"
    )
    table = Table(title=title, show_header=True, header_style="bold")
    rows = ranked(record) if ranked_rows else list(record.plans)
    reference = _reference(record)
    best = _best(rows, reference) if ranked_rows else None
    columns = [*(["best"] if ranked_rows else []), "plan", "params", "grads", "optim", "act"]
    hosted = any(est.host_bytes_per_node for est in record.plans)
    timed = any(est.predicted_step_seconds for est in record.plans)
    clock = ["s/step", "samples/s/dev"] if timed else ["time", "speed"]
    linked = any(est.communication_seconds is not None for est in record.plans)
    columns += ["peak", *(["host/node"] if hosted else []), "fits", *clock, "comm/step"]
    columns += ["comm s"] if linked else []
    columns += ["days"] if record.train_tokens else []
    shown = rows[:top]
    widest = max(len(_short(est.plan)) for est in shown)
    for name in columns:
        plan_column = name == "plan"  # one line each, never cut
        table.add_column(name, justify="left" if plan_column else "right", no_wrap=True,
                         min_width=widest if plan_column else len(name))  # fmt: skip

    def size(value: float) -> str:
        return f"{value / scale:.2f}"

    for est in shown:
        mem = est.memory
        fits = "–" if est.fits is None else ("yes" if est.fits else "no")
        row = [
            *(["*" if est is best else ""] if ranked_rows else []),
            _short(est.plan),
            size(mem.parameters),
            size(mem.gradients),
            size(mem.optimizer_states),
            size(mem.activations + mem.autocast_weight_copies),
            size(mem.peak),
            *([size(est.host_bytes_per_node)] if hosted else []),
            fits,
            *(
                [_seconds(est.predicted_step_seconds), _seconds(est.samples_per_s_per_device)]
                if timed
                else [
                    _ratio(est.predicted_step_time_ratio),
                    _ratio(relative_throughput(est, reference)),
                ]
            ),
            size(est.communication_bytes_per_step),
            *([_seconds(est.communication_seconds)] if linked else []),
        ]
        if record.train_tokens:
            row.append("–" if est.train_days is None else f"{est.train_days:.1f}")
        table.add_row(*row)
    return table


def _ranking_lines(record: EstimateRecord, ranked_rows: bool, top: int | None) -> list[str]:
    reference = _reference(record)
    if any(est.predicted_step_seconds for est in record.plans):
        from autotune.estimator import STEP_SECONDS_BAND

        low, high = STEP_SECONDS_BAND
        lines = [
            "s/step: predicted seconds per optimizer step; samples/s/dev: samples each device "
            "trains per second (micro-batch x accumulation / s/step); – where not predicted",
            f"s/step's interval: x{low:g} to x{high:g} of it (where 8 in 10 plans measured in "
            "bench/step_time.py on GPT-2 small fell; a small model's accumulated micro-batches of "
            "one sample fall above; each plan's in --json)",
        ]
    else:
        lines = [
            f"speed: predicted samples/s over {reference.describe()}'s (samples per step / time)"
        ]
    if ranked_rows:
        rows = ranked(record)
        best = _best(rows, reference)
        if not record.device_memory_bytes:
            lines.append(
                "order: all plans by predicted speed; fit not judged (no budget: give "
                "--device-memory), so no plan is marked best"
            )
        else:
            lines.append(
                "order: the plans that fit by predicted speed, then the plans that do not fit; "
                + (
                    f"* best: {best.plan.describe()}"
                    if best
                    else "no best: no plan that fits has a predicted speed (see the notes)"
                )
            )
    if top is not None and top < len(record.plans):
        lines.append(f"showing the first {top} of {len(record.plans)} plans (--top)")
    return lines


def _footer(
    record: EstimateRecord, *, ranked_rows: bool = False, top: int | None = None
) -> list[str]:
    """Where each figure came from, the order and best plan, and the claim check."""
    first = record.plans[0]
    sources = sorted({est.source for est in record.plans})
    lines = _ranking_lines(record, ranked_rows, top)
    lines += [
        f"model states: formula ({', '.join(sorted({e.accounting for e in record.plans}))} accounting); "
        f"activations: {', '.join(sources)}; peak: {first.memory.peak_composition}",
        (
            "time: the profile's measured phases scaled to each plan (data, forward, backward "
            "with recompute, accumulation, the optimizer step over the rank's shard)"
            if any(est.predicted_step_seconds for est in record.plans)
            else f"time: ratio to {record.baseline.describe() if record.baseline else 'the first plan'} "
            f"({first.time_source or 'not predicted'})"
        )
        + "; communication not overlapped with compute",
        record.margin_note,
    ]
    notes = sorted({note for est in record.plans for note in est.notes})
    lines += [f"note: {note}" for note in notes]
    for check in record.checks:
        lines.append(f"claim check ({check.plan.describe()}): {_verdict(check)}")
        parts = [check.memory.explanation] if check.memory else []
        parts += check.throughput.findings if check.throughput else []
        lines += [f"  {part}" for part in parts]
    return lines


def _verdict(check: ClaimCheck) -> str:
    """``possible``, or ``impossible`` with what cannot be true."""
    memory, rates = check.memory, check.throughput
    problems = [] if memory is None or memory.possible else ["memory below the model-state floor"]
    if rates is not None and rates.consistent is False:
        problems.append("the stated figures disagree")
    if rates is not None and rates.under_peak is False:
        problems.append("over the device's peak")
    return f"impossible ({'; '.join(problems)})" if problems else "possible"
