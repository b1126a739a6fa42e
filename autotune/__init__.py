"""autotune: measure a PyTorch training step, predict plans, suggest and confirm changes.

Public names are re-exported lazily, so ``import autotune`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "AutotuneError": "autotune._errors",
    "Plan": "autotune.plan",
    "parse_plan": "autotune.plan",
    "ProfileRecord": "autotune.records",
    "profile": "autotune.runtime.profiler",
    "estimate": "autotune.estimate",
    "suggest": "autotune.suggest",
    "deepspeed_config": "autotune.dsconfig",
    "recommend": "autotune.recommend",
    "Recommendation": "autotune.recommend",
    "tune": "autotune.search",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
