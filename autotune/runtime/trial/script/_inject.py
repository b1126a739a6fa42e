"""The plan into each entry point: ``TrainingArguments``/``Trainer``, ``deepspeed.initialize`` and
``accelerate.Accelerator``. Each ``patch_*`` runs once, right after its module is imported.

The first entry point the script calls owns the trial (:meth:`ScriptTrial.claim`); the ones it
calls in turn (the Trainer's Accelerator and ``deepspeed.initialize``) get the plan from it and
only report the model and the engine. Micro-batch: the Trainer's is injected; a DeepSpeed or
Accelerate script's reaches its loader through the runner's flag mapping (``--arg-map``) or the
engine, and the first batch is checked against the plan (:meth:`ScriptTrial._check_batch`).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from types import ModuleType
from typing import Any

from autotune.runtime.trial.script import PARAMETERS_ENV
from autotune.runtime.trial.script._measure import ScriptTrial, trial

# Keys of a script's own DeepSpeed config that the plan decides.
_PLAN_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "zero_optimization", "bf16", "fp16", "zero_allow_untested_optimizer")  # fmt: skip


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def uses_engine(current: ScriptTrial) -> bool:
    """As in a model-file trial: a DeepSpeed engine for its plans and for every multi-rank one."""
    return current.plan.uses_deepspeed or _world() > 1


def plan_config(
    current: ScriptTrial, *, base: dict[str, Any] | None = None, parameters: int | None = None,
    hf_auto: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The plan's DeepSpeed config over the script's own (its optimizer, scheduler, clipping)."""
    from autotune.emit import emit_deepspeed_config

    kept = {k: v for k, v in (base or {}).items() if k not in _PLAN_KEYS}
    if parameters is None and os.environ.get(PARAMETERS_ENV, "").isdigit():
        parameters = int(os.environ[PARAMETERS_ENV])
    config = emit_deepspeed_config(current.plan, world_size=_world(), base=kept or None,
                                   hf_auto=hf_auto, parameters=parameters).config  # fmt: skip
    # A torch client optimizer is what model-file trials run too (no DeepSpeed Adam compile).
    config["zero_allow_untested_optimizer"] = True
    return config


def _attach(current: ScriptTrial, model: Any) -> None:
    """Checkpoint the plan's blocks (as a model-file trial does), then watch the model."""
    if current.model is not None:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from autotune.runtime._blocks import apply_checkpointing

    apply_checkpointing(model, current.plan.checkpoint_blocks)
    current.attach(model)

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not current.deepspeed:  # an engine's inner optimizer: its step() says when
            current.step_end()

    register_optimizer_step_post_hook(after_step)


# -- HF Trainer ----------------------------------------------------------------------------


def training_arguments(current: ScriptTrial) -> dict[str, Any]:
    """The ``TrainingArguments`` fields the plan sets (the global batch is the plan's)."""
    from autotune.emit import hf_training_arguments

    settings = current.settings
    measured = settings.max_steps if settings.interval_width is not None else settings.steps
    plan = current.plan
    fields = hf_training_arguments(plan, deepspeed=uses_engine(current))
    fields.update(
        gradient_checkpointing=False, activation_checkpointing=False,  # blocks: _attach
        max_steps=settings.warmup + measured + 2,  # the trial stops the run itself before
        use_cpu=settings.device == "cpu",
        deepspeed=_trainer_config(current) if uses_engine(current) else None,
    )  # fmt: skip
    return fields


def _trainer_config(current: ScriptTrial) -> dict[str, Any]:
    """The plan's config with ``"auto"`` where the Trainer checks its arguments against it, but
    ZeRO's bucket sizes explicit, as the emitted ``ds_config.json`` has them (the Trainer's own
    "auto" would size them by the hidden size, and the peak with them)."""
    config = plan_config(current, hf_auto=True)
    config["zero_optimization"] = plan_config(current)["zero_optimization"]
    return config


def patch_training_arguments(module: ModuleType) -> None:
    cls = module.TrainingArguments
    original = cls.__post_init__

    @functools.wraps(original)
    def __post_init__(self: Any) -> None:
        current = trial()
        owner = current.claim("trainer")
        if owner:
            for name, value in training_arguments(current).items():
                if hasattr(self, name):
                    setattr(self, name, value)
        original(self)
        if owner and uses_engine(current) and _world() > 1:
            # ZeRO-3 builds the script's model inside zero.Init, which needs the process
            # group; on CPU the Trainer's state would not start it before the model is built.
            import deepspeed

            deepspeed.init_distributed()

    cls.__post_init__ = __post_init__


def patch_trainer(module: ModuleType) -> None:
    cls = module.Trainer
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, model: Any = None, *args: Any, **kwargs: Any) -> None:
        if model is not None:
            _attach(trial(), model)
        original(self, model, *args, **kwargs)

    cls.__init__ = __init__


# -- DeepSpeed -----------------------------------------------------------------------------


def _script_config(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The config the script gave ``deepspeed.initialize`` (a dict, a path, or its args')."""
    given = bound.arguments.get("config") or bound.arguments.get("config_params")
    args: Any = bound.arguments.get("args")
    if given is None and getattr(args, "deepspeed_config", None):
        given = args.deepspeed_config
    if isinstance(given, str | os.PathLike):
        with open(given, encoding="utf-8") as handle:
            loaded: dict[str, Any] = json.load(handle)
        return loaded
    return dict(given or {})


def patch_deepspeed(module: ModuleType) -> None:
    from autotune.runtime.extensions import skip_comm_op

    skip_comm_op()  # before the script (or its Trainer) starts DeepSpeed's backend
    original = module.initialize
    signature = inspect.signature(original)

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        current = trial()
        bound = signature.bind(*args, **kwargs)
        model = bound.arguments.get("model")
        if model is not None:
            _attach(current, model)
        current.deepspeed = True
        parameters = sum(p.numel() for p in model.parameters()) if model is not None else None
        if current.claim("deepspeed"):
            bound.arguments["config"] = plan_config(
                current, base=_script_config(bound), parameters=parameters
            )
            bound.arguments.pop("config_params", None)
            script_args: Any = bound.arguments.get("args")
            if getattr(script_args, "deepspeed_config", None):
                import copy

                script_args = copy.copy(script_args)
                script_args.deepspeed_config = None
                bound.arguments["args"] = script_args
        else:  # the Trainer's or Accelerator's call: the plan is in; size ZeRO's buckets now
            _size_buckets(current, bound, parameters)
        result = original(*bound.args, **bound.kwargs)
        _watch_engine(current, result[0])
        return result

    module.initialize = initialize  # type: ignore[attr-defined]


def _size_buckets(
    current: ScriptTrial, bound: inspect.BoundArguments, parameters: int | None
) -> None:
    """The plan's ZeRO section sized to the model, as a model-file trial's: the Trainer and
    Accelerate built their config before the model was known (DeepSpeed's default buckets
    hold 5e8 elements each, and the peak with them)."""
    key = "config" if bound.arguments.get("config") is not None else "config_params"
    given = bound.arguments.get(key)
    if parameters is None or not isinstance(given, dict):
        return
    sized = plan_config(current, parameters=parameters)["zero_optimization"]
    bound.arguments[key] = {**given, "zero_optimization": sized}


def _watch_engine(current: ScriptTrial, engine: Any) -> None:
    """An optimizer step ends where the engine's ``step()`` at an accumulation boundary does."""
    step = engine.step

    @functools.wraps(step)
    def watched(*args: Any, **kwargs: Any) -> Any:
        boundary = engine.is_gradient_accumulation_boundary()
        out = step(*args, **kwargs)
        if boundary:
            current.step_end()
        return out

    engine.step = watched


# -- Accelerate ----------------------------------------------------------------------------


def accelerator_arguments(current: ScriptTrial) -> dict[str, Any]:
    """``Accelerator`` keywords for the plan: precision, accumulation, the DeepSpeed plugin."""
    plan = current.plan
    engine = uses_engine(current)
    # Accelerate's own bf16/fp16 is autocast (amp); under DeepSpeed the config decides.
    own = {"bf16": "bf16", "fp16": "fp16"} if engine else {"amp_bf16": "bf16", "amp_fp16": "fp16"}
    fields: dict[str, Any] = {
        "mixed_precision": own.get(plan.precision, "no"),
        "gradient_accumulation_steps": plan.grad_accum,
    }
    if engine:
        from accelerate.utils import DeepSpeedPlugin

        fields["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=plan_config(current))
        fields["fsdp_plugin"] = None
    return fields


def patch_accelerator(module: ModuleType) -> None:
    cls = module.Accelerator
    original_init, original_prepare = cls.__init__, cls.prepare
    signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        current = trial()
        if current.claim("accelerate"):
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments.update(accelerator_arguments(current))
            original_init(*bound.args, **bound.kwargs)
        else:
            original_init(self, *args, **kwargs)

    @functools.wraps(original_prepare)
    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        model = next((a for a in args if isinstance(a, torch.nn.Module)), None)
        if model is not None:
            _attach(trial(), model)
        return original_prepare(self, *args, **kwargs)

    cls.__init__ = __init__
    cls.prepare = prepare
