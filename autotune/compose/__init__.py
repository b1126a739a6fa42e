"""The composer: one function from a model source and a machine to the facts, the budget, the
policy's plan and one prediction per plan, which every command and the Python API read
(:class:`Composition`). No torch at import; the measuring functions import runtime inside.
"""

from __future__ import annotations

from autotune.compose._composition import Composition, compose, compose_facts
from autotune.compose._sources import (
    SHORT_BATCH,
    TRACED_PRECISIONS,
    completed,
    default_budget,
    hf_config_facts,
    model_file_facts,
    profile_model,
    profiled_model,
    refuse_oversized,
    short_profiles,
    with_traced,
)

__all__ = [
    "SHORT_BATCH",
    "TRACED_PRECISIONS",
    "Composition",
    "completed",
    "compose",
    "default_budget",
    "compose_facts",
    "hf_config_facts",
    "model_file_facts",
    "profile_model",
    "profiled_model",
    "refuse_oversized",
    "short_profiles",
    "with_traced",
]
