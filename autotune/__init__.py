"""autotune: measure a PyTorch training step, predict plans, suggest and confirm changes.

Public names are re-exported lazily, so ``import autotune`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    "AutotuneError": ("autotune.records", "AutotuneError"),
    "Plan": ("autotune.records", "Plan"),
    "parse_plan": ("autotune.records", "parse_plan"),
    "ProfileRecord": ("autotune.records", "ProfileRecord"),
    "Recommendation": ("autotune.records", "Recommendation"),
    "Machine": ("autotune.records", "Machine"),
    "TuneOptions": ("autotune.records", "TuneOptions"),
    "ModelFacts": ("autotune.estimator", "ModelFacts"),
    "facts_from_profile": ("autotune.estimator", "facts_from_profile"),
    "estimate": ("autotune.estimator", "estimate"),
    "estimate_plan": ("autotune.estimator", "estimate_plan"),
    "suggest": ("autotune.policy", "suggest"),
    "policy_plan": ("autotune.policy", "policy_plan"),
    "code_changes_for": ("autotune.emit", "code_changes_for"),
    "hf_training_arguments": ("autotune.emit", "hf_training_arguments"),
    "profile": ("autotune.runtime.profiler", "profile"),
    "deepspeed_config": ("autotune.api", "deepspeed_config"),
    "fsdp2_config": ("autotune.api", "fsdp2_config"),
    "recommend": ("autotune.api", "recommend"),
    "tune": ("autotune.api", "tune_model"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
