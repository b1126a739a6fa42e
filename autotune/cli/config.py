"""`autotune config`: write the DeepSpeed config (or, for ``engine=fsdp2``, the FSDP2 deliverable)
for a recommendation or a plan, atomically."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from autotune.cli import _options
from autotune.cli._common import check_output, console, err_console, user_errors
from autotune.records import AutotuneError

FRAMEWORKS = ("torch", "deepspeed", "hf_trainer", "accelerate")


def config(
    recommendation: Path | None = typer.Argument(
        None, help="A recommendation.json (from `autotune tune`), or a tune record holding one."
    ),
    plan: str | None = typer.Option(
        None,
        "--plan",
        help='Plan knobs instead of a recommendation, e.g. "stage=2,mb=4,ga=8,precision=bf16".',
    ),
    nproc_per_node: int | None = typer.Option(
        None,
        "--nproc-per-node",
        min=1,
        help="Ranks on each node; default: the plan's nproc_per_node.",
    ),
    nnodes: int | None = typer.Option(None, "--nnodes", min=1, help="Nodes; default: the plan's."),
    renamed_world_size: int | None = _options.RENAMED_WORLD_SIZE,
    base: Path | None = typer.Option(
        None,
        "--base",
        help="Your DeepSpeed config to merge into: its keys are kept, conflicts refused.",
    ),
    hf_auto: bool = typer.Option(
        False, "--hf-auto", help='Write "auto" where the HF Trainer / Accelerate fill values.'
    ),
    nvme_path: str | None = typer.Option(None, "--nvme-path", help="Directory for NVMe offload."),
    profile: Path | None = typer.Option(
        None,
        "--profile",
        help="A profile.json: refuse a 16-bit type its device does not support; "
        "for engine=fsdp2, the model's block stack the code shards and checkpoints.",
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Write the config here (atomically); without it, print it."
    ),
    framework: str = typer.Option(
        "deepspeed", "--framework", help=f"Code changes to show: {', '.join(FRAMEWORKS)}."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print only the config JSON on stdout."),
) -> None:
    """Write a ready DeepSpeed config, checked by DeepSpeed itself when it is installed.

    An ``engine=fsdp2`` plan gets its FSDP2 deliverable instead: ``--out`` receives the
    Accelerate config file; the ``fully_shard`` code and HF Trainer arguments are printed.
    """
    with user_errors():
        from autotune.api import deepspeed_config
        from autotune.emit import code_changes_for
        from autotune.records import atomic_write_text

        _options.refuse_renamed(world_size=renamed_world_size)
        if framework not in FRAMEWORKS:
            raise AutotuneError(f"--framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        if out is not None:
            check_output(out, "--out")
        rec = _load_source(recommendation, plan)
        world_size = (
            (nproc_per_node or rec.plan.nproc_per_node) * (nnodes or rec.plan.nnodes)
            if nproc_per_node or nnodes
            else None
        )
        if rec.plan.engine == "fsdp2":
            _check_fsdp2_options(base=base, hf_auto=hf_auto, nvme_path=nvme_path)
            _write_fsdp2(rec, world_size, profile, out, framework, as_json)
            return
        capabilities = _capabilities(profile) if profile else rec.capabilities
        try:
            result = deepspeed_config(
                rec,
                world_size=world_size,
                base=_load_base(base) if base else None,
                hf_auto=hf_auto,
                nvme_path=nvme_path,
                capabilities=capabilities,
            )
        except AutotuneError as exc:
            # The emitter says "base config: ..."; the user knows it by its file name.
            if base is None or not str(exc).startswith("base config: "):
                raise
            raise AutotuneError(
                f"--base {base}: {str(exc).removeprefix('base config: ')}"
            ) from None
        text = json.dumps(result, indent=2) + "\n"
        if out is not None:
            atomic_write_text(out, text)
        if as_json or out is None:
            sys.stdout.write(text)
        if as_json:
            return
        changes = rec.code_changes or code_changes_for(rec.plan)
        _render_summary(out, rec.plan.describe(), result, changes, framework)


def _check_fsdp2_options(*, base: Path | None, hf_auto: bool, nvme_path: str | None) -> None:
    for flag, given in (("--base", base), ("--hf-auto", hf_auto), ("--nvme-path", nvme_path)):
        if given:
            raise AutotuneError(f"{flag}: a DeepSpeed option; the plan is engine=fsdp2")


def _write_fsdp2(
    rec: Any, world_size: int | None, profile: Path | None, out: Path | None,
    framework: str, as_json: bool,
) -> None:  # fmt: skip
    """The FSDP2 deliverable: the Accelerate config (YAML) to ``--out``, the rest printed."""
    from autotune.emit import accelerate_fsdp_yaml
    from autotune.records import atomic_write_text

    result = fsdp2_for_stack(rec, world_size, _block_stack(profile) if profile else None)
    config_file = accelerate_fsdp_yaml(result["accelerate_config"])
    if out is not None:
        atomic_write_text(out, config_file)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    if out is not None:
        console.print(f"wrote {out}  (Accelerate FSDP2 config, plan {result['plan']})",
                      markup=False, soft_wrap=True)  # fmt: skip
    accelerate = [("Accelerator", result["accelerate_code"])]
    if out is None:
        accelerate.insert(0, ("accelerate launch --config_file (YAML)", config_file.rstrip()))
    shown = {
        "torch": [("fully_shard", result["code"])],
        "accelerate": accelerate,
        "hf_trainer": [("TrainingArguments", json.dumps(result["hf_trainer"], indent=2))],
    }
    if framework == "deepspeed":  # the default: no DeepSpeed here, so every FSDP2 form
        err_console.print("note: engine=fsdp2 has no DeepSpeed config; its FSDP2 forms follow "
                          "(--framework torch, accelerate or hf_trainer for one)",
                          markup=False, soft_wrap=True)  # fmt: skip
    for what, text in shown.get(framework, [(k, v) for items in shown.values() for k, v in items]):
        console.print(f"\n# {what} ({result['plan']}):", markup=False, soft_wrap=True)
        console.print(text, markup=False, soft_wrap=True)
    for note in result["notes"]:
        err_console.print(f"note: {note}", markup=False, soft_wrap=True)


def fsdp2_for_stack(rec: Any, world_size: int | None, stack: Any) -> dict[str, Any]:
    """``api.fsdp2_config`` for a model's block stack (a profile's or a tune record's), if known:
    its Python path, the class Accelerate wraps, and L (its switch checkpoints all L or none)."""
    from autotune.api import fsdp2_config
    from autotune.emit import block_stack_expression

    return fsdp2_config(
        rec,
        world_size=world_size,
        block_stack=block_stack_expression(stack.path) if stack else None,
        layer_class=stack.block_class if stack else None,
        num_blocks=stack.count if stack else None,
    )


def _block_stack(path: Path) -> Any:
    from autotune.records import ProfileRecord, read_record

    return read_record(path, ProfileRecord, "profile").model.block_stack


def _load_source(path: Path | None, plan_text: str | None) -> Any:
    from autotune.records import Recommendation, parse_plan, read_json, validate_record

    if (path is None) == (plan_text is None):
        raise AutotuneError("give a RECOMMENDATION.json or --plan KNOBS (exactly one)")
    if plan_text is not None:
        return Recommendation(source="plan", plan=parse_plan(plan_text))
    assert path is not None
    data = read_json(path, "recommendation")
    if isinstance(data, dict) and isinstance(data.get("recommendation"), dict):
        from autotune.records import check_version
        from autotune.search import TuneRecord

        check_version(data, TuneRecord, path, "tune record")
        data = data["recommendation"]  # a tune record: its recommendation is what counts
    return validate_record(data, Recommendation, path, "recommendation")


def _load_base(path: Path) -> dict[str, Any]:
    from autotune.records import read_json

    data = read_json(path, "DeepSpeed config")
    if not isinstance(data, dict):
        raise AutotuneError(
            f"{path}: a DeepSpeed config must be a JSON object, not {type(data).__name__}"
        )
    return data


def _capabilities(path: Path) -> Any:
    from autotune.records import ProfileRecord, read_record

    return read_record(path, ProfileRecord, "profile").environment.capabilities


def _render_summary(
    out: Path | None, plan: str, result: dict[str, Any], changes: list[Any], framework: str
) -> None:
    """What the config means and the code changes it cannot carry: on stdout beside a written
    file, on stderr after a config printed to stdout (so the JSON still pipes alone)."""
    where = console if out is not None else err_console
    zero = result.get("zero_optimization", {})
    micro, accum = (
        result.get("train_micro_batch_size_per_gpu"),
        result.get("gradient_accumulation_steps"),
    )
    total = result.get("train_batch_size")
    world = total // (micro * accum) if isinstance(total, int) and micro and accum else "?"
    head = f"wrote {out}  (plan {plan})" if out is not None else f"the config above: plan {plan}"
    where.print(head, markup=False, soft_wrap=True)
    where.print(
        f"  train_batch_size {total} = micro-batch {micro} x accumulation {accum} x "
        f"world size {world}; ZeRO stage {zero.get('stage', 0)}",
        markup=False,
        soft_wrap=True,
    )
    for change in changes:
        lines = getattr(change, framework)
        if lines:
            where.print(f"\n# {change.what} ({framework}):", markup=False, soft_wrap=True)
            shown = lines.replace('"ds_config.json"', json.dumps(str(out or "ds_config.json")))
            where.print(shown, markup=False, soft_wrap=True)
    err_console.print(
        "(code changes travel beside the config: it cannot carry them)",
        markup=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add this command to the root app."""
    app.command("config")(config)
