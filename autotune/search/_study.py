"""The Optuna study: storage, resuming, asking for the next plan, and reading trials back."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

from autotune.records import AutotuneError, Plan
from autotune.search._records import Role, TrialRecord, TrialState
from autotune.search._space import SearchSpace

DEFAULT_STORAGE = "autotune-tune.db"
_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}


def storage_url(storage: str | None) -> str:
    """An Optuna RDB URL: a URL is kept, a plain path becomes a sqlite file."""
    value = storage or DEFAULT_STORAGE
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).expanduser().resolve()}"


def open_study(storage: str | None, name: str, seed: int | None = None) -> Any:
    """Create or load the study ``name`` in ``storage`` (maximising throughput).

    Raises:
        AutotuneError: the storage cannot be opened.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(storage)
    for attempt in range(5):
        try:
            return _create(url, name, seed)
        except ImportError as exc:
            raise AutotuneError(f"--storage {url}: cannot open the study: {exc}") from None
        except Exception as exc:  # SQLAlchemy errors have no public base importable lazily
            # Workers started together race to create the schema: the loser retries.
            if attempt == 4:
                raise AutotuneError(
                    f"--storage {url}: cannot open the study: {type(exc).__name__}: {exc}"
                ) from None
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def _create(url: str, name: str, seed: int | None) -> Any:
    import optuna

    rdb = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    # No fixed seed by default: workers sharing a study must not draw the same points.
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    return optuna.create_study(
        storage=rdb, study_name=name, direction="maximize", sampler=sampler, load_if_exists=True
    )


def _engine_kwargs(url: str) -> dict[str, Any]:
    # Several local workers share one sqlite file: wait for the lock instead of failing.
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def distributions(space: SearchSpace) -> dict[str, Any]:
    """The Optuna distributions of the space (fixed, so every worker agrees)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dists: dict[str, Any] = {
        "micro_batch": CategoricalDistribution(space.micro_batches),
        "checkpoint_blocks": IntDistribution(0, space.blocks),
        "precision": CategoricalDistribution(list(space.precisions)),
    }
    if space.nproc > 1:
        dists["zero_stage"] = IntDistribution(0, 3)
    return dists


def enqueue(study: Any, space: SearchSpace, plan: Plan, role: Role) -> None:
    """Put ``plan`` in the queue unless the study already holds it (in any state)."""
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("plan") == plan.model_dump(mode="json"):
            return
    attrs = {"plan": plan.model_dump(mode="json"), "role": role}
    study.enqueue_trial(space.params(plan), user_attrs=attrs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_stale(study: Any) -> list[int]:
    """Mark trials left RUNNING by a dead process on this host failed, and queue them again.

    Returns:
        The numbers of the trials marked failed.
    """
    from optuna.trial import TrialState as State

    host = socket.gethostname()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
        attrs = trial.user_attrs
        if attrs.get("host") != host or _alive(int(attrs.get("pid", -1))):
            continue
        study._storage.set_trial_user_attr(
            trial._trial_id, "reason", "left running by a killed process"
        )
        with contextlib.suppress(RuntimeError):
            study.tell(trial.number, state=State.FAIL)
            failed.append(trial.number)
            if "plan" in attrs:
                requeue = {"plan": attrs["plan"], "role": attrs.get("role", "search")}
                study.enqueue_trial(dict(trial.params), user_attrs=requeue)
    return failed


def ask(study: Any, space: SearchSpace) -> tuple[Any, Plan, Role]:
    """The next trial and its plan (an enqueued plan verbatim, else the sampler's point)."""
    trial = study.ask(fixed_distributions=distributions(space))
    attrs = trial.user_attrs
    plan = Plan.model_validate(attrs["plan"]) if "plan" in attrs else space.plan(trial.params)
    role: Role = attrs.get("role", "search")
    trial.set_user_attr("plan", plan.model_dump(mode="json"))
    trial.set_user_attr("role", role)
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    return trial, plan, role


def to_record(trial: Any) -> TrialRecord | None:
    """A stored trial as a :class:`TrialRecord` (``None`` for one that never got a plan)."""
    attrs = trial.user_attrs
    if "plan" not in attrs:
        return None
    state: TrialState = _STATES.get(trial.state.name, "waiting")  # type: ignore[assignment]
    fields = {key: attrs.get(key) for key in _RESULT_KEYS}
    return TrialRecord(number=trial.number, plan=Plan.model_validate(attrs["plan"]),
                       role=attrs.get("role", "search"), state=state, **fields)  # fmt: skip


_RESULT_KEYS = (
    "outcome", "reason", "samples_per_s", "tokens_per_s", "step_time", "peak_memory_bytes",
    "peak_source", "predicted_peak_bytes", "prediction_source", "stderr_tail", "duration_s",
    "fixed_s", "steps_s", "steps_measured", "step_interval", "reused_worker",
    "predicted_step_ratio",
)  # fmt: skip


def records(study: Any) -> list[TrialRecord]:
    """All trials of the study that have a plan, in trial order."""
    found = (to_record(trial) for trial in study.get_trials(deepcopy=False))
    return [record for record in found if record is not None]


def store(trial: Any, record: dict[str, Any]) -> None:
    """Save the result fields of a trial as user attributes (JSON values only)."""
    for key, value in record.items():
        if key in _RESULT_KEYS and value is not None:
            trial.set_user_attr(key, json.loads(json.dumps(value)))
