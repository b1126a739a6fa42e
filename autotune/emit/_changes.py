"""The code changes a DeepSpeed config cannot carry, as exact lines per framework."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from autotune.records import AutotuneError, CodeChange, Plan


def hf_training_arguments(
    plan: Plan, *, num_blocks: int | None = None, deepspeed: bool = True
) -> dict[str, Any]:
    """The ``TrainingArguments`` keywords that run a plan.

    The Trainer's ``bf16``/``fp16`` mean two things. Given the plan's DeepSpeed config
    (``TrainingArguments(..., deepspeed=deepspeed_config(plan))``) they are the config's
    ``bf16.enabled``/``fp16.enabled``, DeepSpeed's 16-bit weights, which the Trainer checks
    against the config (or fills its ``"auto"`` from); without one they are the Trainer's own
    torch.autocast over fp32 weights. So, by the plan's precision:

    ===================  ===============================  =========================
    precision            with the DeepSpeed config        without (``deepspeed=False``)
    ===================  ===============================  =========================
    ``fp32``             both off                         both off
    ``amp_bf16``         both off: the config's           ``bf16=True``
    ``amp_fp16``         ``torch_autocast`` autocasts     ``fp16=True``
    ``bf16``, ``fp16``   ``bf16=True``, ``fp16=True``     refused: needs DeepSpeed
    ===================  ===============================  =========================

    Args:
        plan: the plan.
        num_blocks: L; the Trainer's ``gradient_checkpointing`` switch checkpoints
            every block, so it is set only when the plan checkpoints all L.
        deepspeed: whether the Trainer is given the plan's DeepSpeed config, as the README and
            ``autotune config`` show; ``False``: the plain Trainer, for a plan that needs no
            DeepSpeed engine (``plan.uses_deepspeed`` false).

    Raises:
        AutotuneError: ``deepspeed=False`` for a plan that needs a DeepSpeed engine.

    Example:
        >>> hf_training_arguments(Plan(micro_batch=4, grad_accum=8, precision="bf16"))["bf16"]
        True
        >>> hf_training_arguments(Plan(precision="amp_bf16"), deepspeed=False)["bf16"]
        True
    """
    if not deepspeed and plan.uses_deepspeed:
        raise AutotuneError(
            f"plan {plan.describe()}: needs a DeepSpeed engine (ZeRO, 16-bit weights or "
            "offload): give the Trainer its DeepSpeed config (deepspeed=True)"
        )
    autocast = not deepspeed and plan.precision.startswith("amp_")
    dtype = plan.precision.removeprefix("amp_") if autocast else plan.precision
    args: dict[str, Any] = {
        "per_device_train_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "bf16": dtype == "bf16",
        "fp16": dtype == "fp16",
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
    plan: Plan,
    *,
    block_stack_path: str | None = None,
    num_blocks: int | None = None,
    model_class: str | None = None,
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
        model_class: the model's class (a profile's ``model.class_name``, e.g.
            ``BertForMaskedLM``); the attention lines load it and mask as its head
            does. Unknown: a causal LM.

    Example:
        >>> changes = code_changes_for(Plan(checkpoint_blocks=2), block_stack_path="model.layers",
        ...                            num_blocks=4)
        >>> print(changes[1].torch.splitlines()[-1])
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    """
    fsdp2 = plan.engine == "fsdp2"
    first = _apply_fsdp2(plan, block_stack_path, num_blocks) if fsdp2 else None
    changes = [first or _apply_config(plan, num_blocks)]
    if plan.checkpoint_blocks:
        change = _checkpointing(plan.checkpoint_blocks, block_stack_path, num_blocks)
        # FSDP2's torch and Accelerate lines already checkpoint, before fully_shard
        changes.append(
            change.model_copy(update={"torch": None, "accelerate": None}) if fsdp2 else change
        )
    if plan.dataloader_workers or plan.pin_memory:
        changes.append(_data_loading(plan))
    if plan.attention != "default":
        changes.append(_attention(plan.attention, model_class))
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


def _apply_fsdp2(plan: Plan, path: str | None, num_blocks: int | None) -> CodeChange:
    """An ``engine=fsdp2`` plan: ``fully_shard`` per block and root instead of a DeepSpeed config."""
    from autotune.emit._fsdp import (
        accelerate_plugin_code,
        block_stack_expression,
        fsdp2_code,
        hf_fsdp2_arguments,
    )

    hf_args = hf_fsdp2_arguments(plan, num_blocks=num_blocks)
    hf = ", ".join(f"{key}={value!r}" for key, value in hf_args.items())
    stack = block_stack_expression(path) if path else None
    return CodeChange(
        what=f"shard with PyTorch's FSDP2 (micro-batch {plan.micro_batch}, accumulation "
        f"{plan.grad_accum}, {plan.precision}, reshard_after_forward={plan.reshard_after_forward})",
        torch=fsdp2_code(plan, stack),
        deepspeed=None,
        hf_trainer=f"TrainingArguments(..., {hf})",
        accelerate=accelerate_plugin_code(plan, stack, num_blocks),
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


_CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_SEQ2SEQ_SUFFIXES = ("ForConditionalGeneration", "ForSpeechSeq2Seq", "ForSeq2SeqLM")


def attention_masking(model_class: str | None) -> str:
    """How the model's attention masks, from its transformers class name.

    ``causal`` (decoders: each token sees the ones before it), ``seq2seq`` (a bidirectional
    encoder and a causal decoder), else ``bidirectional`` (masked LMs, classifiers, vision).
    An unknown class is taken as a causal LM, the ``--hf-config`` default.

    Example:
        >>> attention_masking("BertForMaskedLM"), attention_masking("LlamaForCausalLM")
        ('bidirectional', 'causal')
    """
    if model_class is None or model_class.endswith(_CAUSAL_SUFFIXES):
        return "causal"
    return "seq2seq" if model_class.endswith(_SEQ2SEQ_SUFFIXES) else "bidirectional"


_ATTENTION_LINES = {
    ("sdpa", "causal"): "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)",
    ("sdpa", "bidirectional"): (
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding_mask)"
    ),
    ("sdpa", "seq2seq"): (
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)"
        "  # decoder self-attention\n"
        "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=padding_mask)"
        "  # encoder and cross-attention"
    ),
    ("flash_attention_2", "causal"): "flash_attn.flash_attn_func(q, k, v, causal=True)",
    ("flash_attention_2", "bidirectional"): "flash_attn.flash_attn_func(q, k, v, causal=False)",
    ("flash_attention_2", "seq2seq"): (
        "flash_attn.flash_attn_func(q, k, v, causal=True)  # decoder self-attention\n"
        "flash_attn.flash_attn_func(q, k, v, causal=False)  # encoder and cross-attention"
    ),
}


def _attention(kind: str, model_class: str | None) -> CodeChange:
    masking = attention_masking(model_class)
    named = model_class is not None and ("For" in model_class or model_class.endswith("Model"))
    loader = model_class if named else "AutoModelForCausalLM"
    hf = f'{loader}.from_pretrained(name, attn_implementation="{kind}")'
    if kind == "eager":
        torch_line = "softmax(q @ k.transpose(-2, -1) / sqrt(d) + mask) @ v  # explicit attention"
    else:
        torch_line = _ATTENTION_LINES[(kind, masking)]
        if kind == "flash_attention_2":
            torch_line += "  # pip install flash-attn"
    return CodeChange(
        what=f"attention implementation {kind}",
        torch=f"# in the attention module ({masking} masking):\n{torch_line}",
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
