"""The Optuna study: storage, resuming, asking for the next plan, and reading trials back."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from autotune.records import HEARTBEAT_S, AutotuneError, Plan, redact
from autotune.search._records import Role, TrialRecord, TrialState
from autotune.search._runner import pid_alive
from autotune.search._space import SearchSpace
from autotune.search._storage_errors import (
    check_sqlite_path,
    lost_a_race,
    storage_error,
)
from autotune.search._waits import Notice, say

DEFAULT_STORAGE = "autotune-tune.db"
STORAGE_ENV = "AUTOTUNE_STORAGE"
"""The storage used when ``--storage`` is not given: a database URL with a password stays
out of the command line (and the shell history, and ``ps``)."""
RETRY_OF = "retry_of"
"""User attribute of a queued trial that re-runs a trial given back or lost (its number)."""
_STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}
_SQLITE_MAGIC = b"SQLite format 3"
_POSTGRES = ("postgresql://", "postgres://")


def storage_url(storage: str | None) -> str:
    """An Optuna RDB URL: a URL is kept, a plain path becomes a sqlite file; ``None`` is
    ``$AUTOTUNE_STORAGE``, else :data:`DEFAULT_STORAGE`. It may hold a password: show
    :func:`shown_storage` instead. A masked URL (``***``) of the storage in
    ``$AUTOTUNE_STORAGE`` is that storage, password included.

    ``postgresql://`` (SQLAlchemy's psycopg2 default) becomes ``postgresql+psycopg://``
    where only psycopg 3 (the ``postgres`` extra) is installed.
    """
    value = storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    env = os.environ.get(STORAGE_ENV)
    if "***" in value and env and "***" not in env and redact(storage_url(env)) == value:
        # A record shows its storage masked: ``autotune report`` opens it with the password
        # of $AUTOTUNE_STORAGE when that is the same storage.
        return storage_url(env)
    if value.startswith(_POSTGRES):
        import importlib.util

        if importlib.util.find_spec("psycopg2") is None:
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value
    if "://" in value:
        return value
    return f"sqlite:///{Path(value).expanduser().resolve()}"


def shown_storage(storage: str | None) -> str:
    """The storage's URL as printed and written (records, tables, reports): any password is
    ``***``."""
    return redact(storage_url(storage))


def check_storage(storage: str | None) -> str:
    """The URL of a storage ``autotune tune`` can share, checked before any work.

    Raises:
        AutotuneError: a journal file (no heartbeats), a missing database driver.
    """
    url = storage_url(storage)
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
    if path is not None and path.is_file() and path.stat().st_size and not _is_sqlite(path):
        raise AutotuneError(
            f"--storage {storage}: not a sqlite database (an Optuna journal file?); "
            "autotune tune needs sqlite or a database URL, whose heartbeats recover lost trials"
        )
    if url.startswith("postgresql+psycopg://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:
            raise storage_error(storage or url, ImportError(name="psycopg"))
    return url


def _is_sqlite(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(16).startswith(_SQLITE_MAGIC)


def open_study(
    storage: str | None, name: str, seed: int | None = None, heartbeat_s: int = HEARTBEAT_S
) -> Any:
    """Create or load the study ``name`` in ``storage`` (maximising throughput).

    Running trials send a heartbeat every ``heartbeat_s`` seconds; one silent for
    three beats (its worker killed, or its host lost) is failed and queued again by
    Optuna's own :func:`~optuna.storages.fail_stale_trials` (see :func:`recover_stale`).

    Raises:
        AutotuneError: the storage cannot be opened (one line, at once for an
            unreachable server).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = check_storage(storage)
    check_sqlite_path(url)
    for attempt in range(5):
        try:
            return _create(url, name, seed, heartbeat_s)
        except ImportError as exc:
            raise storage_error(url, exc) from None
        except Exception as exc:  # SQLAlchemy errors have no public base importable lazily
            if isinstance(exc.__cause__, ImportError):  # Optuna wraps a missing driver
                raise storage_error(url, exc) from None
            # Workers started together race to create the schema: the loser retries.
            # Anything else (unreachable server, wrong host, bad password) fails at once.
            if attempt == 4 or not lost_a_race(exc):
                raise storage_error(url, exc) from None
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def _create(url: str, name: str, seed: int | None, heartbeat_s: int) -> Any:
    import optuna

    with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        rdb = optuna.storages.RDBStorage(
            url, engine_kwargs=_engine_kwargs(url), heartbeat_interval=heartbeat_s,
            grace_period=3 * heartbeat_s, **_retry_callback(),
        )  # fmt: skip
    # No fixed seed by default: workers sharing a study must not draw the same points.
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)
    return optuna.create_study(
        storage=rdb, study_name=name, direction="maximize", sampler=sampler, load_if_exists=True
    )


def _retry_callback() -> dict[str, Any]:
    """Optuna's retry callback: a lost trial comes back WAITING with the same plan."""
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # Optuna >= 4.9
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=2)
            return {"heartbeat_stale_trial_callback": _RequeueOnce(retry)}
        retry = optuna.storages.RetryFailedTrialCallback(max_retry=2)
        return {"failed_trial_callback": _RequeueOnce(retry)}


class _RequeueOnce:
    """Optuna's retry callback, run for each failed trial by one worker only.

    Two workers calling :func:`~optuna.storages.fail_stale_trials` at once can both fail one
    stale trial on sqlite (each reads it RUNNING before the other writes), and both would
    queue it again: its plan measured twice. The one that claims the re-queue runs the retry.
    """

    def __init__(self, retry: Any) -> None:
        self.retry = retry

    def __call__(self, study: Any, trial: Any) -> None:
        if _claim_requeue(study, trial._trial_id):
            self.retry(study, trial)


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        # Several local workers share one sqlite file: wait for the lock instead of failing.
        return {"connect_args": {"timeout": 60}}
    if url.startswith("postgresql"):
        # An unreachable host fails in seconds, not after the OS's TCP timeout.
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    return {}


def distributions(space: SearchSpace) -> dict[str, Any]:
    """The Optuna distributions of the space (fixed, so every worker agrees)."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    dists: dict[str, Any] = {
        "micro_batch": CategoricalDistribution(space.micro_batches),
        "checkpoint_blocks": IntDistribution(0, space.blocks),
        "precision": CategoricalDistribution(list(space.precisions)),
    }
    if space.world > 1:
        dists["zero_stage"] = IntDistribution(0, 3)
    if space.searches_engine:
        dists["engine"] = CategoricalDistribution(list(space.engines))
    return dists


def enqueue(study: Any, space: SearchSpace, plan: Plan, role: Role) -> None:
    """Put ``plan`` in the queue unless the study already holds it (in any state)."""
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("plan") == plan.model_dump(mode="json"):
            return
    attrs = {"plan": plan.model_dump(mode="json"), "role": role}
    study.enqueue_trial(space.params(plan), user_attrs=attrs)


def recover_stale(study: Any) -> list[int]:
    """Fail the trials whose worker stopped sending heartbeats (on any host), and queue them again.

    Optuna's :func:`~optuna.storages.fail_stale_trials` does the work; the storage's
    retry callback re-enqueues each with its plan and role.

    Returns:
        The numbers of the trials marked failed by this call.
    """
    import optuna
    from optuna.trial import TrialState as State

    running = {
        t._trial_id: t.number for t in study.get_trials(deepcopy=False, states=(State.RUNNING,))
    }
    if not running:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    failed = study.get_trials(deepcopy=False, states=(State.FAIL,))
    return sorted(running[t._trial_id] for t in failed if t._trial_id in running)


def worker_name() -> str:
    """This worker as a study's records name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def claim(study: Any, marker: str) -> bool:
    """Claim ``marker`` for this caller: ``True`` for exactly one caller per marker.

    The claim is the creation of a marker study named ``marker`` in the study's storage,
    whose names every Optuna RDB storage keeps unique, so of two workers claiming at once
    exactly one succeeds.
    """
    import optuna

    try:
        optuna.create_study(storage=study._storage, study_name=marker)
    except optuna.exceptions.DuplicatedStudyError:
        return False
    return True


def heartbeat_interval(study: Any) -> float:
    """The study storage's heartbeat interval in seconds (0 without heartbeats)."""
    return float(study._storage.get_heartbeat_interval() or 0)


def beat(study: Any, trial: Any) -> None:
    """Record one heartbeat of ``trial`` now (a database hiccup is not fatal)."""
    with contextlib.suppress(Exception):
        study._storage.record_heartbeat(trial._trial_id)


def lost(trial: Any) -> bool:
    """Whether a stored trial was failed for lack of heartbeats (no outcome, and no reason:
    a trial given back has one)."""
    attrs = trial.user_attrs
    return trial.state.name == "FAIL" and "outcome" not in attrs and "reason" not in attrs


def ask(study: Any, space: SearchSpace) -> tuple[Any, Plan, Role]:
    """The next trial and its plan: a retry first (a plan given back or lost, which a
    resumed run owes), then an enqueued plan verbatim, else the sampler's point."""
    with warnings.catch_warnings():  # Optuna expects heartbeats with optimize(); we beat ourselves
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        trial = _pop_retry(study, space)
        while trial is None:
            trial = study.ask(fixed_distributions=distributions(space))
            if _queued(study, trial) and not _take(study, trial):
                trial = None  # another worker took this queued trial at the same moment
    beat(study, trial)  # at once: a trial with no heartbeat yet would never be found lost
    attrs = trial.user_attrs
    plan = Plan.model_validate(attrs["plan"]) if "plan" in attrs else space.plan(trial.params)
    role: Role = attrs.get("role", "search")
    trial.set_user_attr("plan", plan.model_dump(mode="json"))
    trial.set_user_attr("role", role)
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    return trial, plan, role


def wait_for_earlier_plans(study: Any, number: int, poll_s: float = 0.02) -> None:
    """Wait until every running trial numbered below ``number`` has named its plan.

    A trial gets its number when it is created and its plan a moment later, once the
    sampler has drawn it. Two workers may draw the same plan; the lower number runs
    it, so the higher must see the lower's plan before it decides. A trial whose worker
    died before naming its plan is given up on after 3 heartbeat intervals, when
    Optuna would take it for lost anyway.
    """
    from optuna.trial import TrialState as State

    wait = 3 * (heartbeat_interval(study) or HEARTBEAT_S)
    deadline, notice = time.monotonic() + wait, Notice()
    while time.monotonic() < deadline:
        running = study.get_trials(deepcopy=False, states=(State.RUNNING,))
        unnamed = [t.number for t in running if t.number < number and "plan" not in t.user_attrs]
        if not unnamed:
            return
        if notice.due():
            say(f"trial {number} waits up to {wait:.0f} s for trial(s) "
                f"{', '.join(map(str, unnamed))} of other workers to name their plans, so that "
                "two workers do not run one plan")  # fmt: skip
        time.sleep(poll_s)


def _pop_retry(study: Any, space: SearchSpace) -> Any:
    """Take the oldest queued retry (as ``Study.ask`` takes the oldest queued trial), or ``None``.

    Its parameters are suggested from the fixed values it was queued with.
    """
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState as State

    for waiting in study.get_trials(deepcopy=False, states=(State.WAITING,)):
        if not is_retry(waiting):
            continue
        try:  # False, or an error: another worker took it first
            if not study._storage.set_trial_state_values(waiting._trial_id, state=State.RUNNING):
                continue
        except UpdateFinishedTrialError:
            continue
        if not _take(study, waiting):
            continue
        trial = optuna.Trial(study, waiting._trial_id)
        for name, dist in distributions(space).items():
            if isinstance(dist, CategoricalDistribution):
                trial.suggest_categorical(name, dist.choices)
            else:
                trial.suggest_int(name, dist.low, dist.high)
        return trial
    return None


def _queued(study: Any, trial: Any) -> bool:
    """Whether ``study.ask`` took ``trial`` from the queue (an enqueued plan) rather than
    creating it."""
    return "fixed_params" in study._storage.get_trial_system_attrs(trial._trial_id)


def _take(study: Any, trial: Any) -> bool:
    """Claim a queued trial this worker has just set RUNNING: ``True`` for one worker only.

    sqlite has no ``SELECT ... FOR UPDATE``, and Python's sqlite3 driver begins a
    transaction only at its first write, so two workers can both read a queued trial
    WAITING and both set it RUNNING (Optuna's take, and :func:`_pop_retry`'s). Both then
    ran it, and the second to finish failed on a finished trial. The claim is atomic on
    every storage (:func:`claim`); the worker that loses it leaves the trial to the other.
    """
    return claim(study, f"{study.study_name}:took-trial:{trial._trial_id}")


def _claim_requeue(study: Any, trial_id: int) -> bool:
    """Claim the one re-queue of a failed trial (by :func:`give_back`, :func:`fail_dead_local`
    or the heartbeat retry): ``True`` for one worker only, as :func:`_take`."""
    return claim(study, f"{study.study_name}:requeued-trial:{trial_id}")


def is_retry(trial: Any) -> bool:
    """Whether a stored trial re-runs a plan that was started and not measured: queued by
    :func:`give_back` or :func:`fail_dead_local`, or by Optuna's heartbeat retry callback."""
    return RETRY_OF in trial.user_attrs or "failed_trial" in trial.system_attrs


def to_record(trial: Any) -> TrialRecord | None:
    """A stored trial as a :class:`TrialRecord` (``None`` for one that never got a plan)."""
    attrs = trial.user_attrs
    if "plan" not in attrs:
        return None
    state: TrialState = _STATES.get(trial.state.name, "waiting")  # type: ignore[assignment]
    fields = {key: attrs.get(key) for key in _RESULT_KEYS}
    if lost(trial):
        fields["reason"] = (
            "lost: its worker stopped sending heartbeats (killed, or host lost); queued again"
        )
    return TrialRecord(number=trial.number, plan=Plan.model_validate(attrs["plan"]),
                       role=attrs.get("role", "search"), state=state, **fields)  # fmt: skip


_RESULT_KEYS = (
    "outcome", "reason", "samples_per_s", "tokens_per_s", "step_time", "peak_memory_bytes",
    "peak_source", "predicted_peak_bytes", "prediction_source", "stderr_tail", "duration_s",
    "fixed_s", "steps_s", "steps_measured", "step_interval", "reused_worker",
    "predicted_step_ratio", "link",
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


def give_back(study: Any, trial: Any, why: str) -> bool:
    """Mark a trial this process is running failed (``why`` as its reason) and queue its
    plan again, so an interrupted run loses nothing and the next run measures it first.

    Returns:
        ``False`` when the trial had already finished (nothing to give back).
    """
    return _fail_and_requeue(study, study._storage.get_trial(trial._trial_id), why)


def fail_dead_local(study: Any) -> list[int]:
    """Give back the trials left RUNNING by a process of this host that is gone (killed
    with SIGKILL: it could not give them back itself), without waiting for heartbeats.

    Returns:
        The numbers of the trials this call failed and queued again.
    """
    from optuna.trial import TrialState as State

    host, failed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        if trial.user_attrs.get("host") != host or not isinstance(pid, int) or pid_alive(pid):
            continue
        if _fail_and_requeue(study, trial, f"left running by a killed process (pid {pid})"):
            failed.append(trial.number)
    return failed


def _fail_and_requeue(study: Any, stored: Any, why: str) -> bool:
    """Fail a running trial and queue its plan again: ``True`` for the one caller that did.

    Of two workers failing one trial, the second usually finds it finished; on sqlite both
    can read it RUNNING and both fail it, and only the one that claims the re-queue queues it.
    """
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState as State

    if stored.state != State.RUNNING:
        return False
    try:
        study._storage.set_trial_user_attr(stored._trial_id, "reason", f"{why}: queued again")
        study._storage.set_trial_state_values(stored._trial_id, state=State.FAIL)
    except UpdateFinishedTrialError:
        return False
    if not _claim_requeue(study, stored._trial_id):
        return False
    attrs = stored.user_attrs
    if "plan" in attrs:
        requeue = {"plan": attrs["plan"], "role": attrs.get("role", "search"),
                   RETRY_OF: stored.number}  # fmt: skip
        study.enqueue_trial(dict(stored.params), user_attrs=requeue)
    return True
