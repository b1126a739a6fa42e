"""The plan record: every knob the method turns, shared by estimate, suggest, tune and config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from autotune.records._base import Record
from autotune.records._errors import AutotuneError

Precision = Literal["fp32", "amp_bf16", "amp_fp16", "bf16", "fp16"]
"""``fp32``; ``amp_*``: torch autocast with fp32 parameters; ``bf16``/``fp16``:
DeepSpeed-style 16-bit weights with an fp32 master copy in the optimizer."""

AUTOCAST_PLAN_PRECISION: dict[str, Precision] = {
    "fp32": "fp32",
    "bf16": "amp_bf16",
    "fp16": "amp_fp16",
}
"""The plan precision of ``autotune profile --precision`` (autocast dtype, fp32 weights)."""

Offload = Literal["none", "cpu", "nvme"]
Attention = Literal["default", "eager", "sdpa", "flash_attention_2"]
Engine = Literal["deepspeed", "fsdp2"]
"""``deepspeed``: a DeepSpeed engine runs ZeRO; ``fsdp2``: PyTorch's ``fully_shard`` does
(stage 2 = ``reshard_after_forward=False``, stage 3 = ``True``, ``offload_param=cpu`` =
``CPUOffloadPolicy``, ``bf16`` = ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``)."""


class Plan(Record):
    """One training configuration. Immutable; derive variants with :meth:`with_changes`.

    ``checkpoint_blocks`` counts how many of the L blocks of the model's repeated
    stack are checkpointed (Megatron's "block" method; L is what
    ``gradient_checkpointing_enable()`` does).
    """

    precision: Precision = "fp32"
    checkpoint_blocks: int = Field(0, ge=0, description="blocks of the stack checkpointed, 0..L")
    micro_batch: int = Field(1, ge=1, description="samples per device per forward")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage")
    offload_optimizer: Offload = "none"
    offload_param: Offload = "none"
    nproc_per_node: int = Field(1, ge=1, description="ranks on each node, as torchrun counts them")
    nnodes: int = Field(1, ge=1, description="nodes, as torchrun counts them")
    attention: Attention = "default"
    compile: bool = False
    dataloader_workers: int = Field(0, ge=0)
    pin_memory: bool = False
    engine: Engine = "deepspeed"

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed(cls, data: Any) -> Any:
        """A record written with an old spelling of the rank count is refused, naming the new."""
        if isinstance(data, dict):
            for old in RENAMED_RANK_KNOBS.keys() & data.keys():
                raise ValueError(f"{old}: renamed to {RENAMED_RANK_KNOBS[old]}")
        return data

    @model_validator(mode="after")
    def _check_offload(self) -> Plan:
        if self.engine == "fsdp2":
            _check_fsdp2(self)
        if self.offload_param != "none" and self.zero_stage != 3:
            raise ValueError("offload_param needs zero_stage 3")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        return self

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP2's ``reshard_after_forward``: True for stage 3, False for stage 2."""
        return self.zero_stage >= 3

    @property
    def world_size(self) -> int:
        """Data-parallel devices in all."""
        return self.nproc_per_node * self.nnodes

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: micro-batch x accumulation x world size."""
        return self.micro_batch * self.grad_accum * self.world_size

    @property
    def uses_deepspeed(self) -> bool:
        """Whether running this plan needs a DeepSpeed engine."""
        return self.engine == "deepspeed" and (
            self.zero_stage > 0
            or self.precision in ("bf16", "fp16")
            or self.offload_optimizer != "none"
        )

    def with_changes(self, **changes: object) -> Plan:
        """A validated copy with some knobs changed."""
        return Plan.model_validate({**self.model_dump(), **changes})

    def describe(self) -> str:
        """Short knob string, the same syntax :func:`parse_plan` reads."""
        return format_plan(self)


def _check_fsdp2(plan: Plan) -> None:
    """What FSDP2 can express of a plan; one line naming the knob otherwise."""
    if plan.zero_stage not in (2, 3):
        raise ValueError(
            f"engine=fsdp2 needs zero_stage 2 (reshard_after_forward=False) or 3 (True), "
            f"got {plan.zero_stage}: FSDP2 always shards gradients and optimizer states"
        )
    if plan.precision in ("fp16", "amp_fp16"):
        raise ValueError(
            "engine=fsdp2 takes precision fp32, amp_bf16 or bf16 (fp16 needs a loss scaler)"
        )
    if plan.offload_optimizer != "none":
        raise ValueError(
            "engine=fsdp2 offloads parameters, gradients and optimizer states together: "
            "use offload_param=cpu (CPUOffloadPolicy), not offload_optimizer"
        )
    if plan.offload_param == "nvme":
        raise ValueError("engine=fsdp2 offloads to cpu only (CPUOffloadPolicy), not nvme")


def fsdp2_equivalent(plan: Plan) -> Plan | None:
    """The ``engine=fsdp2`` plan closest to a DeepSpeed ZeRO plan, or ``None`` where none is.

    Stage 2 and 3 map one to one; stage 1 maps to stage 2 (FSDP2 always shards the
    gradients too: less memory, the same all-reduce volume). Parameter offload to the
    CPU maps to ``CPUOffloadPolicy``; optimizer-only offload, NVMe and fp16 have no
    FSDP2 form.
    """
    if plan.engine != "deepspeed" or plan.zero_stage == 0:
        return None
    if plan.precision in ("fp16", "amp_fp16") or "nvme" in (
        plan.offload_param,
        plan.offload_optimizer,
    ):
        return None
    if plan.offload_optimizer != "none" and plan.offload_param == "none":
        return None
    return plan.with_changes(
        engine="fsdp2", zero_stage=max(plan.zero_stage, 2), offload_optimizer="none"
    )


_ALIASES = {
    "stage": "zero_stage",
    "zero": "zero_stage",
    "mb": "micro_batch",
    "micro_batch_size": "micro_batch",
    "ga": "grad_accum",
    "accum": "grad_accum",
    "ckpt": "checkpoint_blocks",
    "checkpoint": "checkpoint_blocks",
    "workers": "dataloader_workers",
    "attn": "attention",
}
RENAMED_RANK_KNOBS = {
    "gpus": "nproc_per_node",
    "gpus_per_node": "nproc_per_node",
    "nodes": "nnodes",
    "world_size": "nproc_per_node and nnodes (world size = their product)",
}
"""Old spellings of the rank count, refused wherever a plan is read, with the one word for each:
torchrun's ``--nproc-per-node`` and ``--nnodes``."""
_SHORT = {value: key for key, value in _ALIASES.items() if key in ("stage", "mb", "ga", "ckpt")}


_EXAMPLES = {"precision": "bf16", "checkpoint_blocks": "12", "micro_batch": "4", "grad_accum": "8",
             "zero_stage": "2", "offload_optimizer": "cpu", "offload_param": "cpu",
             "nproc_per_node": "8", "nnodes": "2", "attention": "sdpa", "compile": "true",
             "dataloader_workers": "4", "pin_memory": "true", "engine": "fsdp2"}  # fmt: skip
_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}  # fmt: skip
EVERY_BLOCK = "all"
"""``ckpt=all``: every one of the model's L blocks, resolved by whoever knows L."""
Blocks = int | Literal["later"] | None
"""L as a caller of :func:`parse_plan` knows it: a count; ``"later"`` (read ``ckpt=all`` as 0
now, parse again once L is known); ``None`` (not known here: ``ckpt=all`` is refused)."""


def parse_plan(
    text: str, base: Plan | None = None, flag: str = "--plan", *, blocks: Blocks = None
) -> Plan:
    """Read ``"stage=2,mb=4,ckpt=12,precision=bf16"`` into a plan, over ``base``.

    The grammar is the same wherever a plan is given (``--plan``, ``--baseline``, ``--check``,
    the Python API): ``key=value`` pairs split at commas, each knob once (an alias such as
    ``mb`` for ``micro_batch`` counts as its knob).

    Args:
        text: the knobs.
        base: the plan the knobs change (default: :class:`Plan`'s defaults).
        flag: the flag or argument the text came from, named in every error.
        blocks: L, the model's block count, where the caller knows it: ``ckpt=all`` is L and a
            count above L is refused. ``"later"``: L is known later (a check before any work:
            ``ckpt=all`` reads as 0). ``None``: L is not known here and ``ckpt=all`` is refused.

    Raises:
        AutotuneError: one line naming the flag and the bad knob or value.
    """
    values = (base or Plan()).model_dump()
    every_block = False
    for name, (key, raw) in _knobs(text, flag).items():
        if name == "checkpoint_blocks" and raw == EVERY_BLOCK:
            every_block = True
        elif name in ("compile", "pin_memory"):
            if raw.lower() not in _SWITCH:
                raise AutotuneError(f"{flag}: {key}={raw}: give true or false")
            values[name] = _SWITCH[raw.lower()]
        else:
            values[name] = raw
    if every_block:
        if blocks is None:
            raise AutotuneError(
                f"{flag}: ckpt=all: the model's block count L is not known here; give ckpt=N"
            )
        values["checkpoint_blocks"] = 0 if blocks == "later" else blocks
    try:
        plan = Plan.model_validate(values)
    except ValueError as exc:
        raise AutotuneError(f"{flag}: {text!r}: {_first_error(exc)}") from None
    if isinstance(blocks, int) and plan.checkpoint_blocks > blocks:
        raise AutotuneError(
            f"{flag}: ckpt={plan.checkpoint_blocks}: more blocks than the model's L={blocks}"
        )
    return plan


def _knobs(text: str, flag: str) -> dict[str, tuple[str, str]]:
    """The ``key=value`` items of a plan string by field name: (the key as given, the value)."""
    known = sorted(set(Plan.model_fields) | set(_ALIASES))
    knobs: dict[str, tuple[str, str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = (part.strip() for part in item.partition("="))
        name = _ALIASES.get(key, key)
        if key in RENAMED_RANK_KNOBS:
            raise AutotuneError(f"{flag}: {key}: renamed to {RENAMED_RANK_KNOBS[key]}")
        if name not in Plan.model_fields:
            raise AutotuneError(f"{flag}: unknown knob {key!r} (known: {', '.join(known)})")
        if not sep or not raw:
            raise AutotuneError(f"{flag}: {key}: give a value, e.g. {key}={_EXAMPLES[name]}")
        if name in knobs:
            first, value = knobs[name]
            raise AutotuneError(f"{flag}: {name} given twice ({first}={value}, {key}={raw})")
        knobs[name] = (key, raw)
    return knobs


def format_plan(plan: Plan) -> str:
    """The knobs that differ from the defaults, as ``key=value`` pairs."""
    default = Plan()
    parts = []
    for name in Plan.model_fields:
        value = getattr(plan, name)
        if name in ("precision", "micro_batch", "zero_stage") or value != getattr(default, name):
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            parts.append(f"{_SHORT.get(name, name)}={shown}")
    return ",".join(parts)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = ".".join(str(part) for part in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")  # pydantic's, for a ValueError
        return f"{loc}: {msg}" if loc else msg
    return str(exc)
