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
    link: Path | None = _options.LINK,
    pcie_gbps: float | None = _options.PCIE_GBPS,
    host_memory: str | None = _options.HOST_MEMORY,
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
    renamed_gpus_per_node: int | None = _options.RENAMED_GPUS_PER_NODE,
) -> None:
    """Propose the next change, then the rest of the ordered plan, from a saved profile.

    Exits 1 (after printing) when the final plan cannot keep --global-batch, 2 on bad input.
    """
    with user_errors():
        from autotune.policy import suggest
        from autotune.records import AutotuneError, ProfileRecord, read_record

        _options.refuse_renamed(world_size=world_size, gpus_per_node=renamed_gpus_per_node)
        known = ("torch", "accelerate", "deepspeed", "hf_trainer")
        if framework is not None and framework not in known:
            raise AutotuneError(f"--framework: {framework!r} is not one of {', '.join(known)}")
        machine = _options.machine(device_memory=device_memory, margin=margin,
                                   nproc_per_node=nproc_per_node, nnodes=nnodes,
                                   inter_gbps=inter_gbps, pcie_gbps=pcie_gbps,
                                   host_memory=host_memory, link=link)  # fmt: skip
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
    from rich.text import Text

    from autotune.policy import SuggestRecord

    assert isinstance(record, SuggestRecord)
    console.print(f"baseline plan: {record.baseline.describe()}", markup=False, soft_wrap=True)
    console.print(f"policy: {record.policy}", markup=False, soft_wrap=True)
    console.print(_budget(record), soft_wrap=True, markup=False)
    if not record.suggestions:
        console.print("nothing to suggest: no rule of the policy applies to this profile")
    previous = record.baseline
    for index, item in enumerate(record.suggestions, 1):
        title = "next change" if index == 1 else f"then {index}"
        change = ", ".join(f"{knob}={_show(value)}" for knob, value in item.change.items())
        evidence = "; ".join(
            f"{_LABELS.get(name, name.replace('_', ' '))} {_show(fact.value)} "
            f"({'not given' if fact.value is None and fact.source == 'given' else _SOURCES.get(fact.source, fact.source)})"
            for name, fact in item.evidence.items()
        )
        lines = [
            f"  evidence: {evidence}",
            f"  predicted: {_predicted(item.predicted)}",
            f"  why: {item.reason}",
        ]
        switched = _precision_switch(item.change, previous)
        if switched:
            lines.append(f"  note: {switched}")
        previous = item.plan
        if item.fsdp2_alternative:
            lines.append(
                f"  or with PyTorch's FSDP2: {item.fsdp2_alternative} "
                f"(autotune config --plan '{item.fsdp2_alternative}')"
            )
        # a policy's own words (its rules, reasons) are printed as written, never read as markup
        head = Text.assemble((f"{title}: {item.rule}", "bold"), f": {change}")
        console.print(head, soft_wrap=True, highlight=False)
        console.print("\n".join(lines), soft_wrap=True, markup=False, highlight=False)
    console.print(f"final plan: {record.final_plan.describe()}", markup=False, soft_wrap=True)
    if record.final_predicted is not None:
        console.print(f"  predicted against the baseline: {_predicted(record.final_predicted)}",
                      markup=False, soft_wrap=True)  # fmt: skip
    for note in record.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def _predicted(pred: object) -> str:
    from autotune.policy import Predicted

    assert isinstance(pred, Predicted)
    memory = f"peak {format_bytes(pred.peak_bytes_before)} -> {format_bytes(pred.peak_bytes_after)}"
    if pred.fits_after is not None:
        memory += ", fits" if pred.fits_after else ", does not fit"
    memory += f" (predicted from {pred.memory_source} activations)"
    if pred.host_bytes_after:
        fits = {True: ", fits", False: ", does not fit", None: ""}[pred.host_fits_after]
        memory += f"; host RAM {format_bytes(pred.host_bytes_after)} per node{fits}"
    if pred.offload_bytes_per_step:
        seconds = (
            f"{pred.offload_seconds:.3f} s"
            if pred.offload_seconds is not None
            else "time not included: give --pcie-gbps"
        )
        memory += (
            f"; offload moves {format_bytes(pred.offload_bytes_per_step)} per step over the "
            f"host link ({seconds})"
        )
        memory += (
            f", and the optimizer steps on the host's CPU ({pred.host_optimizer_seconds:.3g} s)"
            if pred.host_optimizer_seconds is not None
            else ", and the optimizer steps on the host's CPU (time not predicted: the profile "
            "probed no host Adam rate)"
        )
    if pred.step_time_ratio is None:
        return f"{memory}; step time not predicted"
    # The estimate scales measured phase times: a prediction, though from measured numbers.
    how = "formula on measured times" if pred.time_source == "measured" else pred.time_source
    span = pred.step_seconds_interval_after
    clock = (
        f": {pred.step_seconds_after:.3g} s per step"
        + (f" [{span[0]:.3g}, {span[1]:.3g}]" if span else "")
        + f", {pred.samples_per_s_per_device_after:.3g} samples/s per device"
        if pred.step_seconds_after and pred.samples_per_s_per_device_after
        else ""
    )
    return f"{memory}; step time x{pred.step_time_ratio:.2f} per sample ({how}){clock}"


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


_LABELS = {
    "precision": "precision",
    "fast_bf16": "fast bf16 matmul",
    "bf16_speed_ratio": "bf16 matmul speed over fp32",
    "bf16_supported": "bf16 supported",
    "fp16_supported": "fp16 supported",
    "device_type": "device",
    "device_memory": "budget per device",
    "has_block_stack": "a repeated block stack",
    "block_count": "blocks in the stack",
    "fits": "fits the budget",
    "peak_bytes": "predicted peak",
    "headroom": "headroom (share of the budget)",
    "activation_share": "activations' share of the peak",
    "model_state_share": "model states' share of the peak",
    "checkpoint_blocks_to_fit": "fewest checkpointed blocks that fit",
    "checkpoint_micro_batch": "larger micro-batch checkpointing buys",
    "checkpoint_micro_batch_blocks": "blocks it needs checkpointed",
    "checkpoint_micro_batch_ratio": "its step time over the fastest plan without checkpointing",
    "micro_batch_to_fit": "largest micro-batch that fits",
    "micro_batch_for_global_batch": "largest micro-batch that keeps the global batch and fits",
    "target_global_batch": "target global batch",
    "global_batch": "global batch",
    "world_size": "ranks",
    "nnodes": "nodes",
    "nproc_per_node": "ranks per node",
    "inter_gbps": "link between nodes (Gbit/s)",
    "input_share": "share of the step waiting for data",
    "is_transformer": "a transformer",
    "sdpa_available": "PyTorch SDPA available",
    "flash_attn_available": "flash-attn installed",
    "compute_capability": "CUDA compute capability",
    "zero_stage": "ZeRO stage",
    "micro_batch": "micro-batch",
    "grad_accum": "gradient accumulation",
    "checkpoint_blocks": "checkpointed blocks",
    "dataloader_workers": "DataLoader workers",
    "pin_memory": "pinned batches",
    "attention": "attention kernel",
    "compile": "torch.compile",
    "offload_optimizer": "optimizer offload",
    "offload_param": "parameter offload",
    "step_time_ratio": "predicted step time over the baseline's",
    "amp_peak_ratio": "predicted peak under bf16 autocast over now",
}
"""The policy's facts in the words a DeepSpeed or PyTorch user reads (``--json`` keeps the names)."""
_SOURCES = {
    "formula": "predicted",
    "plan": "current plan",
    "refused": "refused as impossible: see notes",
}


def _budget(record: object) -> str:
    """The budget the advice was judged against, and the usable part after the margin."""
    from autotune.policy import SuggestRecord

    assert isinstance(record, SuggestRecord)
    budget = record.device_memory_bytes
    if budget is None:
        return "budget: none given or known (--device-memory): nothing judged to fit"
    where = {"given": "given", "device": "the GPU's memory",
             "available_ram": "this machine's available memory"}.get(record.budget_source or "", "given")  # fmt: skip
    usable = budget * (1 - record.margin)
    return (f"budget: {format_bytes(budget)} per device ({where}); usable {format_bytes(usable)} "
            f"after the {record.margin:.0%} margin")  # fmt: skip


def _precision_switch(change: dict[str, object], before: object) -> str | None:
    """A line naming a switch between torch autocast and 16-bit weights, which a rule makes
    as a side effect of its own change (ZeRO needs DeepSpeed's bf16)."""
    new = change.get("precision")
    old = getattr(before, "precision", None)
    if not isinstance(new, str) or not isinstance(old, str) or new == old:
        return None
    if old.startswith("amp_") and not new.startswith("amp_"):
        return (f"precision {old} -> {new}: torch autocast over fp32 weights becomes DeepSpeed's "
                f"{new} (16-bit weights and gradients, fp32 master copies in the optimizer)")  # fmt: skip
    return None
