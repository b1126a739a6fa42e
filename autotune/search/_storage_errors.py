"""What goes wrong opening a study's storage, said in one line that names the fix."""

from __future__ import annotations

import re
from pathlib import Path

from autotune.records import AutotuneError, redact

POSTGRES_EXTRA = "pip install 'autotune-advisor[postgres]'"


def check_sqlite_path(url: str) -> None:
    """Refuse an sqlite URL whose folder does not exist, before SQLAlchemy tries it.

    Raises:
        AutotuneError: naming the storage and the missing folder.
    """
    if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
        return
    folder = Path(url.removeprefix("sqlite:///")).parent
    if not folder.is_dir():
        raise AutotuneError(f"--storage {url}: directory {folder} does not exist")


def storage_error(url: str, exc: BaseException) -> AutotuneError:
    """One line for a storage that did not open: a missing driver names what to install;
    a database error keeps its first line (SQLAlchemy's "Background on this error" link goes).
    """
    shown = redact(url)
    cause = exc.__cause__ or exc
    if isinstance(exc, ImportError) or isinstance(cause, ImportError):
        return AutotuneError(f"--storage {shown}: {_missing_driver(url, cause)}")
    lines = [line for line in str(cause).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", first).strip()
    return AutotuneError(
        f"--storage {shown}: cannot open the study: {type(cause).__name__}: {first}"
    )


def _missing_driver(url: str, cause: BaseException) -> str:
    scheme = url.partition("://")[0]
    dialect, _, driver = scheme.partition("+")
    module = getattr(cause, "name", None) or driver or "its driver"
    if dialect in ("postgresql", "postgres"):
        if driver in ("", "psycopg"):
            return (f"the PostgreSQL driver ({module}) is not installed: {POSTGRES_EXTRA} "
                    "(psycopg 3, which a plain postgresql:// URL uses)")  # fmt: skip
        return (f"the PostgreSQL driver {module!r} is not installed: install it, or write "
                f"postgresql:// and {POSTGRES_EXTRA} (psycopg 3)")  # fmt: skip
    return f"the database driver {module!r} for {scheme}:// is not installed: install it"


_RACE = re.compile(
    r"locked|already exists|unique|duplicate|deadlock|could not serialize|integrity",
    re.IGNORECASE,
)


def lost_a_race(exc: BaseException) -> bool:
    """Whether opening failed because another worker was creating the same schema or study
    at the same moment (worth a retry), not because the storage is wrong (not worth one).
    """
    cause = exc.__cause__ or exc
    return bool(_RACE.search(f"{type(exc).__name__} {exc} {type(cause).__name__} {cause}"))
