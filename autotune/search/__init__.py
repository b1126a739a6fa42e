"""The search stage: the space, the Optuna study, trial runners (how a trial is launched:
``_runner.py``; over several nodes: ``_agents.py``), workers sharing a study (``_shared.py``),
outcome classification, the final comparison and ``tune()``.
"""

from __future__ import annotations

from autotune.records import (
    EXTENSIONS_DIR,
    GUARD_EXIT,
    LIFELINE_ENV,
    PROBE_ENV,
    PROFILE_ENV,
    SCRIPT_SPEC_ENV,
    EntryPoints,
    ScriptProbe,
    StepSplit,
    TrialResult,
    TrialSettings,
    WorkerSpec,
    done_path,
    request_path,
    stop_path,
)
from autotune.search._agents import (
    AgentRunner,
    parse_endpoint,
    serve,
    versions,
)
from autotune.search._compare import (
    compare,
    recommendation,
)
from autotune.search._identity import check_identity
from autotune.search._pool import PoolRunner
from autotune.search._profiles import shared_profiles
from autotune.search._records import (
    Outcome,
    TrialRecord,
    TrialState,
    TuneRecord,
)
from autotune.search._runner import (
    SubprocessRunner,
    TrialRunner,
)
from autotune.search._script_runner import (
    ARG_KEYS,
    ScriptRunner,
    check_command,
    command_ranks,
    parse_arg_map,
    script_command,
)
from autotune.search._space import (
    Predict,
    Prediction,
    divisors,
)
from autotune.search._steer import (
    FRONT_SIZE,
    rank,
)
from autotune.search._study import (
    ask,
    open_study,
    records,
    storage_url,
    store,
)
from autotune.search._tune import (
    Progress,
    trial_settings,
    tune,
)

__all__ = [
    "GUARD_EXIT",
    "AgentRunner",
    "ARG_KEYS",
    "ask",
    "check_command",
    "check_identity",
    "command_ranks",
    "compare",
    "divisors",
    "done_path",
    "EntryPoints",
    "EXTENSIONS_DIR",
    "FRONT_SIZE",
    "LIFELINE_ENV",
    "open_study",
    "Outcome",
    "parse_arg_map",
    "parse_endpoint",
    "PoolRunner",
    "Predict",
    "Prediction",
    "PROBE_ENV",
    "PROFILE_ENV",
    "Progress",
    "rank",
    "recommendation",
    "records",
    "request_path",
    "script_command",
    "SCRIPT_SPEC_ENV",
    "ScriptProbe",
    "ScriptRunner",
    "serve",
    "shared_profiles",
    "StepSplit",
    "stop_path",
    "storage_url",
    "store",
    "SubprocessRunner",
    "trial_settings",
    "TrialRecord",
    "TrialResult",
    "TrialRunner",
    "TrialSettings",
    "TrialState",
    "tune",
    "TuneRecord",
    "versions",
    "WorkerSpec",
]
