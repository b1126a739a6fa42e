"""autotune: measure a PyTorch training step, predict plans, suggest and confirm changes.

Public names are re-exported lazily, so ``import autotune`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS = {
    "AutotuneError": ("autotune._errors", "AutotuneError"),
    "Plan": ("autotune.plan", "Plan"),
    "parse_plan": ("autotune.plan", "parse_plan"),
    "ProfileRecord": ("autotune.records", "ProfileRecord"),
    "profile": ("autotune.runtime.profiler", "profile"),
    "ModelFacts": ("autotune._estimate", "ModelFacts"),
    "facts_from_profile": ("autotune._estimate", "facts_from_profile"),
    "estimate": ("autotune._estimate", "estimate"),
    "estimate_plan": ("autotune._estimate", "estimate_plan"),
    "suggest": ("autotune._suggest", "suggest"),
    "policy_plan": ("autotune._suggest", "policy_plan"),
    "deepspeed_config": ("autotune.dsconfig", "deepspeed_config"),
    "recommend": ("autotune._recommend", "recommend"),
    "Recommendation": ("autotune._recommend", "Recommendation"),
    "code_changes_for": ("autotune._recommend", "code_changes_for"),
    "tune": ("autotune.search._prepare", "tune_model"),
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
