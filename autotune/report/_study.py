"""Read an Optuna study from the storage optuna-dashboard opens (sqlite URL or journal file)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.records import AutotuneError
from autotune.search import TrialRecord, records, storage_url

if TYPE_CHECKING:
    import optuna

_SQLITE_MAGIC = b"SQLite format 3"
MIN_TRIALS_FOR_IMPORTANCE = 20
"""Optuna's default evaluator (PED-ANOVA) compares the best 10% of trials with all of them:
under 20 completed trials that best 10% is a single trial and the importances are noise."""


def open_study(name: str, storage: str) -> optuna.Study:
    """Load study ``name`` from ``storage`` without creating anything.

    Args:
        name: the study name.
        storage: what ``autotune tune --storage`` took: an SQLAlchemy URL, or a file path
            (an sqlite database, as tune writes, or an Optuna journal file).

    Raises:
        AutotuneError: the storage does not exist or has no such study (the names it has are listed).
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = _storage(storage)
    try:
        return optuna.load_study(study_name=name, storage=backend)
    except KeyError:
        every = optuna.get_all_study_names(storage=backend)
        # Not tune's marker studies (STUDY:took-trial:ID, STUDY:requeued-trial:ID, ...).
        names = ", ".join(n for n in every if not any(n.startswith(f"{m}:") for m in every))
        names = names or "none"
        raise AutotuneError(
            f"--study: no study {name!r} in {storage} (studies there: {names})"
        ) from None


def _storage(storage: str) -> Any:
    import optuna

    if "://" not in storage:
        path = Path(storage).expanduser()
        if not path.is_file():
            raise AutotuneError(f"--storage: no such file {storage}")
        if not path.read_bytes()[:16].startswith(_SQLITE_MAGIC):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    url = storage_url(storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        # Optuna would create an empty database at a mistyped path; refuse instead.
        raise AutotuneError(f"--storage: no such sqlite database {url.removeprefix('sqlite:///')}")
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as exc:  # SQLAlchemy raises many types for a bad URL or file
        raise AutotuneError(
            f"--storage: cannot open {storage}: {type(exc).__name__}: {exc}"
        ) from None


def study_trials(study: optuna.Study) -> tuple[list[TrialRecord], str | None]:
    """The study's trials as tune writes them, and a note when some had no autotune plan."""
    found = records(study)
    foreign = len(study.trials) - len(found)
    note = (
        f"{foreign} trial(s) of study {study.study_name!r} have no autotune plan and are not shown"
    )
    return found, note if foreign else None


def importances(study: optuna.Study) -> tuple[dict[str, float] | None, str | None]:
    """Optuna's parameter importances, or ``None`` and the reason they were skipped."""
    import optuna
    from optuna.trial import TrialState

    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        return None, (
            f"parameter importances skipped: {len(done)} completed trial(s), "
            f"need at least {MIN_TRIALS_FOR_IMPORTANCE}"
        )
    target = None if len(study.directions) == 1 else (lambda t: t.values[0])
    try:
        found = optuna.importance.get_param_importances(study, target=target)
    except (RuntimeError, ValueError) as exc:
        return None, f"parameter importances skipped: {exc}"
    if not found:
        return None, "parameter importances skipped: no parameter varied across completed trials"
    return {name: float(value) for name, value in found.items()}, None
