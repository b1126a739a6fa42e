"""Read the report's input files into records, each failure as one line naming the file or flag."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from autotune.confirm import ConfirmRecord
from autotune.policy import SuggestRecord
from autotune.records import AutotuneError, ProfileRecord, Recommendation, RecordT, read_record
from autotune.report._build import ReportInputs
from autotune.search import TuneRecord

if TYPE_CHECKING:
    import optuna


def load_inputs(
    *,
    profile: Path | None = None,
    suggestions: Path | None = None,
    confirm: Path | None = None,
    tune: Path | None = None,
    study: str | None = None,
    storage: str | None = None,
    recommendation: Path | None = None,
    device_memory: int | None = None,
) -> ReportInputs:
    """Load every input that was given.

    Args:
        profile: a profile.json from ``autotune profile``.
        suggestions: a suggest record from ``autotune suggest --json``.
        confirm: the session log of ``autotune confirm``: measured effect, kept or rejected.
        tune: a tune record from ``autotune tune``; its study is opened for importances when found.
        study: an Optuna study name, read from ``storage`` (exclusive with ``tune``).
        storage: the study's storage: an SQLAlchemy URL or an Optuna journal file.
        recommendation: a recommendation record.
        device_memory: the budget per device in bytes, when the records do not say.

    Raises:
        AutotuneError: a file is missing or invalid, or the flags do not go together.
    """
    if (study is None) != (storage is None):
        raise AutotuneError("--study and --storage go together: give both or neither")
    if study is not None and tune is not None:
        raise AutotuneError("give either --tune or --study/--storage, not both")
    tune_record = _read(tune, TuneRecord, "tune record")
    opened = None
    if study is not None and storage is not None:
        from autotune.report._study import open_study

        opened = open_study(study, storage)
    elif tune_record is not None and tune is not None:
        opened = _tune_study(tune_record, tune)
    return ReportInputs(
        profile=_read(profile, ProfileRecord, "profile"),
        suggestions=_read(suggestions, SuggestRecord, "suggest record"),
        confirm=_read(confirm, ConfirmRecord, "confirm log"),
        tune=tune_record,
        study=opened,
        recommendation=_read(recommendation, Recommendation, "recommendation"),
        device_memory=device_memory,
    )


def _read(path: Path | None, model: type[RecordT], what: str) -> RecordT | None:
    return None if path is None else read_record(path, model, what)


def _tune_study(record: TuneRecord, path: Path) -> optuna.Study | None:
    """The tune run's own study, looked up as written and beside the tune file; ``None`` if absent."""
    from autotune.report._study import open_study

    candidates = [record.storage]
    if "://" not in record.storage and not Path(record.storage).is_absolute():
        candidates.append(str(path.parent / record.storage))
    elif record.storage.startswith("sqlite:///") and not record.storage.startswith("sqlite:////"):
        candidates.append(
            "sqlite:///" + str(path.parent / record.storage.removeprefix("sqlite:///"))
        )
    for storage in candidates:
        try:
            return open_study(record.study, storage)
        except AutotuneError:
            continue
    return None
