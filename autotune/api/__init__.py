"""The Python API, one module per family: ``tune`` (``_tune.py``), ``recommend``
(``_recommend.py``), ``confirm`` (``_confirm.py``), the deliverables ``deepspeed_config`` and
``fsdp2_config`` (``_configs.py``) and script trials (``_scripts.py``). Each composes its run
once through :mod:`autotune.compose` and injects the trial processes into the search.

Runtime modules are imported inside the functions, so ``autotune config`` and
``autotune suggest`` never import torch through here.
"""

from __future__ import annotations

from autotune.api._common import GUARD_SHARE, check_model_path, default_guard, tune_records
from autotune.api._configs import deepspeed_config, fsdp2_config
from autotune.api._confirm import confirm
from autotune.api._recommend import HOOKS, hooks_model_file, recommend
from autotune.api._scripts import NO_PROFILE, check_script, profile_script, tune_script
from autotune.api._tune import check_tune, serve_agent, tune_composition, tune_model

__all__ = [
    "GUARD_SHARE",
    "HOOKS",
    "NO_PROFILE",
    "check_model_path",
    "check_script",
    "check_tune",
    "confirm",
    "deepspeed_config",
    "default_guard",
    "fsdp2_config",
    "hooks_model_file",
    "profile_script",
    "recommend",
    "serve_agent",
    "tune_composition",
    "tune_model",
    "tune_records",
    "tune_script",
]
