"""Records on disk: written atomically, read back equal, refused in one line when they are not
what this autotune reads (missing, not JSON, another schema version, a wrong field)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.records import AutotuneError, atomic_write_text, read_record, write_record
from autotune.search import TrialSettings, TuneRecord


def _record() -> TuneRecord:
    return TuneRecord(model_file="m.py", study="s", storage="sqlite:///s.db", global_batch=8,
                      nproc_per_node=2, nnodes=1, device_memory=None, objective="samples_per_s",
                      trials=[], comparison=None, recommendation=None, notes=["n"])  # fmt: skip


def test_a_record_reads_back_equal_through_plain_json(tmp_path: Path) -> None:
    path = write_record(tmp_path / "t.json", _record())
    assert read_record(path, TuneRecord, "tune record") == _record()
    data = json.loads(path.read_text())  # plain JSON any tool can read
    assert data["global_batch"] == 8 and data["schema_version"] == 1


def test_writes_are_atomic_and_leave_no_temporary_behind(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    inode = target.stat().st_ino
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and target.stat().st_ino != inode  # renamed into place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with pytest.raises(AutotuneError, match="does not exist"):
        atomic_write_text(tmp_path / "missing" / "x.txt", "x")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such tune record file"),
        ("{not json", "not valid JSON (line 1"),
        (json.dumps({"schema_version": 99}), "99"),
        (
            _record().model_dump_json().replace('"global_batch":8', '"global_batch":"eight"'),
            "global_batch",
        ),
    ],
)
def test_a_bad_record_is_refused_in_one_line_naming_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AutotuneError) as caught:
        read_record(path, TuneRecord, "tune record")
    text = str(caught.value)
    assert str(path) in text and message in text and "\n" not in text


def test_nested_records_validate_on_load(tmp_path: Path) -> None:
    settings = TrialSettings(model_file="m.py", steps=2)
    path = write_record(tmp_path / "s.json", settings)
    data = json.loads(path.read_text())
    data["steps"] = 0  # the record's own bound (steps >= 1) holds on load too
    path.write_text(json.dumps(data))
    with pytest.raises(AutotuneError, match="steps"):
        read_record(path, TrialSettings, "settings")
