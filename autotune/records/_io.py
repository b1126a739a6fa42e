"""Atomic file writes and validated loading of JSON records."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from autotune.records._errors import AutotuneError

RecordT = TypeVar("RecordT", bound=BaseModel)


def redact(text: str) -> str:
    """``text`` (a URL, or a command line holding one) with any URL's password replaced by
    ``***``: what is printed, logged or kept in a record or a study."""
    return re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", text)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename.

    A reader never sees a half-written file, and an error leaves any earlier
    file at ``path`` untouched.
    """
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, as :func:`atomic_write_text` does for text."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise AutotuneError(f"{target}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_record(path: str | os.PathLike[str], record: BaseModel) -> Path:
    """Write a pydantic record as indented JSON, atomically."""
    return atomic_write_text(path, record.model_dump_json(indent=2) + "\n")


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """Parse a JSON file, turning every failure into one line naming the file."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AutotuneError(f"{source}: no such {what} file") from None
    except OSError as exc:
        raise AutotuneError(f"{source}: cannot read {what}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AutotuneError(f"{source}: not valid JSON (line {exc.lineno}: {exc.msg})") from None


def check_version(data: Any, model: type[BaseModel], source: object, what: str) -> None:
    """Refuse a record written for another ``schema_version`` than ``model`` reads.

    A newer record may hold fields or meanings this version does not know; an
    older one may mean something else by a field of the same name. Neither is
    read as if it were current (no migration exists yet: version 1 is the first).
    A record without the field is taken as current.

    Raises:
        AutotuneError: naming the file, the record's version and the one this autotune reads.
    """
    field = model.model_fields.get("schema_version")
    if field is None or not isinstance(data, dict) or "schema_version" not in data:
        return
    found, known = data["schema_version"], field.default
    if not isinstance(found, int) or isinstance(found, bool) or found == known:
        return  # a non-integer is the validator's to report
    if found > known:
        raise AutotuneError(
            f"{source}: {what} has schema_version {found}, newer than the {known} this "
            f"autotune reads: upgrade autotune to read it"
        )
    raise AutotuneError(
        f"{source}: {what} has schema_version {found}, older than the {known} this autotune "
        f"reads, and there is no migration: re-create it with this version"
    )


def validate_record(data: Any, model: type[RecordT], source: object, what: str) -> RecordT:
    """Validate parsed JSON as ``model``; the first error names the source and the field.

    A record of another ``schema_version`` is refused first (:func:`check_version`).
    """
    check_version(data, model, source, what)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise AutotuneError(
            f"{source}: not a valid {what}: field {field}: {first['msg']}"
        ) from None


def read_record(path: str | os.PathLike[str], model: type[RecordT], what: str) -> RecordT:
    """Load and validate a JSON record, turning every failure into one line.

    Args:
        path: the file to read.
        model: the pydantic model the file must match.
        what: a short name for the record in messages (e.g. "profile").
    """
    return validate_record(read_json(path, what), model, Path(path), what)
