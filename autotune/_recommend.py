"""The recommendation record: the plan to use, its evidence, and how to apply it.

Owned by the DeepSpeed-config work (issue 5); the tune work (issue 6) fills it.
"""

from __future__ import annotations

import importlib.metadata
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from autotune._errors import AutotuneError
from autotune._record import Record as _Record
from autotune.plan import Plan
from autotune.records import Capabilities

SCHEMA_VERSION = 1


class MeasuredPlan(_Record):
    """A plan with what real runs of it measured (medians, and an interval over repeats)."""

    plan: Plan
    samples_per_s: float
    samples_per_s_interval: tuple[float, float] | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    repeats: int = 1


class CodeChange(_Record):
    """A change a DeepSpeed config cannot carry, with the exact lines per framework."""

    what: str = Field(description="e.g. activation checkpointing of blocks 0-11")
    torch: str | None = None
    deepspeed: str | None = None
    hf_trainer: str | None = None
    accelerate: str | None = None


class Recommendation(_Record):
    """The plan to use and why; ``deepspeed_config()`` gives its DeepSpeed config.

    Example:
        >>> from autotune import Plan, Recommendation
        >>> rec = Recommendation(source="plan", plan=Plan(zero_stage=1, micro_batch=2))
        >>> rec.deepspeed_config(world_size=4)["train_batch_size"]
        8
    """

    schema_version: int = SCHEMA_VERSION
    source: Literal["tune", "suggest", "estimate", "plan"]
    plan: Plan
    model_file: str | None = None
    best: MeasuredPlan | None = None
    baseline: MeasuredPlan | None = None
    speedup: float | None = None
    speedup_interval: tuple[float, float] | None = None
    code_changes: list[CodeChange] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    capabilities: Capabilities | None = Field(
        None, description="the measured device's precision support; None = not measured"
    )
    parameters: int | None = Field(
        None, description="the model's parameter count, which sizes ZeRO's buckets; None = unknown"
    )

    def deepspeed_config(
        self,
        world_size: int | None = None,
        base: dict[str, Any] | None = None,
        hf_auto: bool = False,
        nvme_path: str | None = None,
    ) -> dict[str, Any]:
        """The DeepSpeed config for :attr:`plan`; see :func:`autotune.dsconfig.deepspeed_config`."""
        from autotune.dsconfig import deepspeed_config

        return deepspeed_config(
            self, world_size=world_size, base=base, hf_auto=hf_auto, nvme_path=nvme_path
        )


def hf_training_arguments(plan: Plan, *, num_blocks: int | None = None) -> dict[str, Any]:
    """The ``TrainingArguments`` keywords that match a plan's DeepSpeed config.

    The HF Trainer checks explicit config values against these (and fills
    ``"auto"`` ones from them), so they must agree with the plan.

    Args:
        plan: the plan.
        num_blocks: L; the Trainer's ``gradient_checkpointing`` switch checkpoints
            every block, so it is set only when the plan checkpoints all L.

    Example:
        >>> hf_training_arguments(Plan(micro_batch=4, grad_accum=8, precision="bf16"))["bf16"]
        True
    """
    args: dict[str, Any] = {
        "per_device_train_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "max_grad_norm": 1.0,
    }
    if plan.dataloader_workers or plan.pin_memory:
        args.update(
            dataloader_num_workers=plan.dataloader_workers, dataloader_pin_memory=plan.pin_memory
        )
    if plan.compile:
        args["torch_compile"] = True
    if plan.checkpoint_blocks and plan.checkpoint_blocks == num_blocks:
        args.update(
            **{_hf_checkpointing(): True, f"{_hf_checkpointing()}_kwargs": {"use_reentrant": False}}
        )
    return args


def code_changes_for(
    plan: Plan, *, block_stack_path: str | None = None, num_blocks: int | None = None
) -> list[CodeChange]:
    """What the plan needs beyond its DeepSpeed config, as exact lines per framework.

    DeepSpeed's ``activation_checkpointing`` section only affects code that calls
    ``deepspeed.checkpointing``, so checkpointing, data loading, attention and
    compile are changes to the training script.

    Args:
        plan: the plan to apply.
        block_stack_path: dotted path of the model's repeated blocks (e.g.
            ``model.layers``, from a profile); a placeholder when unknown.
        num_blocks: L, the number of blocks; when the plan checkpoints all of
            them the frameworks' one-line switches apply.

    Example:
        >>> changes = code_changes_for(Plan(checkpoint_blocks=2), block_stack_path="model.layers",
        ...                            num_blocks=4)
        >>> print(changes[1].torch.splitlines()[-1])
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    """
    changes = [_apply_config(plan, num_blocks)]
    if plan.checkpoint_blocks:
        changes.append(_checkpointing(plan.checkpoint_blocks, block_stack_path, num_blocks))
    if plan.dataloader_workers or plan.pin_memory:
        changes.append(_data_loading(plan))
    if plan.attention != "default":
        changes.append(_attention(plan.attention))
    if plan.compile:
        changes.append(_compile())
    return changes


def _apply_config(plan: Plan, num_blocks: int | None) -> CodeChange:
    hf_args = hf_training_arguments(plan, num_blocks=num_blocks)
    args = ", ".join(f"{key}={value!r}" for key, value in hf_args.items())
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(plan.precision, "no")
    torch_lines = None
    if not plan.uses_deepspeed:
        torch_lines = f"loader = DataLoader(dataset, batch_size={plan.micro_batch})\n"
        if plan.grad_accum > 1:
            torch_lines += f"# step the optimizer every {plan.grad_accum} micro-batches, loss / {plan.grad_accum}\n"
        if plan.precision.startswith("amp_"):
            dtype = "bfloat16" if plan.precision == "amp_bf16" else "float16"
            torch_lines += f'with torch.autocast("cuda", dtype=torch.{dtype}):\n    loss = loss_fn(model, batch)'
    return CodeChange(
        what=f"run with the DeepSpeed config (micro-batch {plan.micro_batch}, "
        f"accumulation {plan.grad_accum}, {plan.precision}, ZeRO stage {plan.zero_stage})",
        torch=torch_lines,
        deepspeed="engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, "
        'config="ds_config.json")\n'
        "loss = engine(batch)  # forward\nengine.backward(loss)\nengine.step()  # every micro-batch",
        hf_trainer=f'TrainingArguments(..., deepspeed="ds_config.json", {args})',
        accelerate=f"accelerator = Accelerator(mixed_precision={mixed!r}, "
        f"gradient_accumulation_steps={plan.grad_accum}, "
        f'deepspeed_plugin=DeepSpeedPlugin(hf_ds_config="ds_config.json"))\n'
        f"loader = DataLoader(dataset, batch_size={plan.micro_batch})",
    )


def _checkpointing(blocks: int, path: str | None, total: int | None) -> CodeChange:
    stack = (
        f'model.get_submodule("{path}")'
        if path
        else "model.layers  # <- your nn.ModuleList of blocks"
    )
    which = "all blocks" if blocks == total else f"the first {blocks} blocks"
    wrap = (
        "import functools\nfrom torch.utils.checkpoint import checkpoint\n\n"
        f"blocks = {stack}\n"
        f"for block in blocks[:{blocks}]:\n"
        "    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)"
    )
    everything = blocks == total
    name = _hf_checkpointing()
    hf_lines = f'model.{name}_enable({name}_kwargs={{"use_reentrant": False}})'
    return CodeChange(
        what=f"activation checkpointing of {which}"
        + (f" of {path} (blocks 0-{blocks - 1})" if path else f" (blocks 0-{blocks - 1})"),
        torch=wrap,
        deepspeed=wrap + "\n# before deepspeed.initialize; the config's activation_checkpointing "
        "section does not checkpoint an HF or plain torch model",
        hf_trainer=f'TrainingArguments(..., {name}=True, {name}_kwargs={{"use_reentrant": False}})'
        if everything
        else wrap + f"\n# before Trainer(model=model, ...); leave {name}=False",
        accelerate=(hf_lines if everything else wrap) + "\n# before accelerator.prepare(...)",
    )


def _hf_checkpointing() -> str:
    """The HF name of the switch: transformers 5 renamed gradient_ to activation_checkpointing."""
    try:
        major = int(importlib.metadata.version("transformers").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        major = 5
    return "activation_checkpointing" if major >= 5 else "gradient_checkpointing"


def _data_loading(plan: Plan) -> CodeChange:
    kwargs = f"num_workers={plan.dataloader_workers}, pin_memory={plan.pin_memory}"
    loader = f"DataLoader(dataset, batch_size={plan.micro_batch}, {kwargs})"
    return CodeChange(
        what=f"data loading with {plan.dataloader_workers} workers, pin_memory={plan.pin_memory}",
        torch=loader,
        deepspeed=loader,
        hf_trainer=f"TrainingArguments(..., dataloader_num_workers={plan.dataloader_workers}, "
        f"dataloader_pin_memory={plan.pin_memory})",
        accelerate=loader + "  # then accelerator.prepare(..., loader)",
    )


def _attention(kind: str) -> CodeChange:
    hf = f'AutoModelForCausalLM.from_pretrained(name, attn_implementation="{kind}")'
    torch_line = {
        "sdpa": "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
        "eager": "softmax(q @ k.transpose(-2, -1) / sqrt(d)) @ v  # explicit attention",
        "flash_attention_2": "flash_attn.flash_attn_func(q, k, v, causal=True)  # pip install flash-attn",
    }[kind]
    return CodeChange(
        what=f"attention implementation {kind}",
        torch=f"# in the attention module:\n{torch_line}",
        deepspeed=f"{hf}  # or model.set_attn_implementation({kind!r})",
        hf_trainer=hf,
        accelerate=hf,
    )


def _compile() -> CodeChange:
    return CodeChange(
        what="torch.compile",
        torch="model = torch.compile(model)",
        deepspeed="engine.compile()  # after deepspeed.initialize",
        hf_trainer="TrainingArguments(..., torch_compile=True)",
        accelerate='Accelerator(..., dynamo_backend="inductor")',
    )


def recommend(
    model_file_or_callables: str | Path | Mapping[str, Callable[..., Any]],
    *,
    global_batch: int,
    world_size: int = 1,
    device_memory: int | None = None,
    search: bool = False,
    device: str = "auto",
    gpus_per_node: int | None = None,
    **options: Any,
) -> Recommendation:
    """The whole loop from Python: profile, then the policy's plan or a tuning search.

    Args:
        model_file_or_callables: a model file (``build_model()`` and
            ``build_batch(batch_size)`` or ``build_dataloader(batch_size)``, optional
            ``loss_fn`` and ``build_optimizer``, as ``autotune profile`` reads it), or
            those hooks as a dict of module-level functions.
        global_batch: samples per optimizer step over all ranks, kept by every plan.
        world_size: data-parallel ranks the plan is for (with ``search``, trials
            run this many processes here).
        device_memory: bytes per device to plan for; ``None`` uses the profiled device's.
        search: ``False`` profiles once and takes the policy's plan; ``True`` runs
            real trials (``autotune tune``) and takes the measured best.
        device: where to profile and run trials (``auto``, ``cpu``, ``cuda``).
        gpus_per_node: devices per node, when ``world_size`` spans several nodes.
        **options: passed on to the search when ``search`` is true (``trials``,
            ``budget_s``, ``steps``, ``storage``, ``runner``, ...).

    Returns:
        A :class:`Recommendation`; its ``deepspeed_config()`` is the config dict.

    Raises:
        AutotuneError: bad arguments, a broken model file, or a search in which
            no trial succeeded.
    """
    if global_batch < 1 or world_size < 1 or global_batch % world_size:
        raise AutotuneError(
            f"recommend: global_batch {global_batch} must be a positive multiple of world_size {world_size}"
        )
    if not isinstance(model_file_or_callables, Mapping):
        return _recommend(Path(model_file_or_callables), search, global_batch=global_batch,
                          world_size=world_size, device_memory=device_memory, device=device,
                          gpus_per_node=gpus_per_node, **options)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="autotune-hooks-") as directory:
        shim = Path(directory) / "hooks.py"
        shim.write_text(hooks_model_file(model_file_or_callables), encoding="utf-8")
        rec = _recommend(shim, search, global_batch=global_batch, world_size=world_size,
                         device_memory=device_memory, device=device, gpus_per_node=gpus_per_node,
                         **options)  # fmt: skip
    names = ", ".join(
        f"{fn.__module__}.{fn.__qualname__}" for fn in model_file_or_callables.values()
    )
    return rec.model_copy(update={"model_file": f"callables: {names}"})


HOOKS = ("build_model", "build_batch", "build_dataloader", "loss_fn", "build_optimizer")


def hooks_model_file(hooks: Mapping[str, Callable[..., Any]]) -> str:
    """A model file that imports the given hooks by reference (trials run in child processes).

    Raises:
        AutotuneError: an unknown hook name, or a function a child process cannot import
            (a lambda or a function defined inside another function).
    """
    lines = ["import importlib.util, sys", f"sys.path[:0] = {sys.path!r}"]
    for name, fn in hooks.items():
        qualname = getattr(fn, "__qualname__", "")
        if name not in HOOKS:
            raise AutotuneError(f"recommend: unknown hook {name!r} (known: {', '.join(HOOKS)})")
        if not callable(fn) or not qualname or "<" in qualname or "." in qualname:
            raise AutotuneError(
                f"recommend: {name} must be a module-level function (trials import it)"
            )
        source = getattr(sys.modules.get(fn.__module__), "__file__", None)
        if fn.__module__ == "__main__" and source:
            # Loaded under another name, so the script's `if __name__ == "__main__":` does not rerun.
            lines += [f"_spec = importlib.util.spec_from_file_location('_autotune_main', {source!r})",
                      "_main = importlib.util.module_from_spec(_spec)", "_spec.loader.exec_module(_main)",
                      f"{name} = _main.{qualname}"]  # fmt: skip
        else:
            lines.append(f"from {fn.__module__} import {qualname} as {name}")
    return "\n".join(lines) + "\n"


def _recommend(model_file: Path, search: bool, **kwargs: Any) -> Recommendation:
    if not search:
        options = {key: kwargs[key] for key in ("global_batch", "world_size", "device_memory",
                                                "device", "gpus_per_node")}  # fmt: skip
        return _recommend_by_policy(model_file, **options)
    from autotune.search._prepare import tune_model

    kwargs.pop("gpus_per_node")
    record = tune_model(str(model_file), nproc=kwargs.pop("world_size"), **kwargs)
    if record.recommendation is None:
        raise AutotuneError(
            f"recommend: no trial of {model_file} succeeded, so nothing to recommend"
        )
    return record.recommendation


def _recommend_by_policy(
    model_file: str | Path, *, global_batch: int, world_size: int, device_memory: int | None,
    device: str, gpus_per_node: int | None,
) -> Recommendation:  # fmt: skip
    from autotune._suggest import policy_plan
    from autotune.runtime.profiler import profile

    # A short profile at a small share of the per-rank batch, as `autotune tune` takes.
    per_rank = global_batch // world_size
    record = profile(model_file, batch_size=min(2, per_rank), steps=2, warmup=1, device=device)
    plan = policy_plan(record, device_memory=device_memory, world_size=world_size,
                       gpus_per_node=gpus_per_node, global_batch=global_batch)  # fmt: skip
    stack = record.model.block_stack
    return Recommendation(
        source="suggest",
        plan=plan,
        model_file=str(model_file),
        code_changes=code_changes_for(
            plan,
            block_stack_path=stack.path if stack else None,
            num_blocks=stack.count if stack else None,
        ),  # fmt: skip
        notes=[
            "from one short profile and the policy's rules; not confirmed by trials (search=True is)"
        ],
        capabilities=record.environment.capabilities,
        parameters=record.model.parameters,
    )
