"""Under ``CI=true`` a service test that cannot start fails instead of skipping (conftest)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
NEEDS_POSTGRES = """
def test_needs_postgres(postgres_server):
    assert postgres_server
"""


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), (None, "1 skipped")])
def test_a_missing_postgres_fails_under_ci_and_skips_elsewhere(
    ci: str | None, outcome: str, tmp_path: Path
) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs.py").write_text(NEEDS_POSTGRES, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(tmp_path)  # no initdb, no pg_ctl
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert outcome in done.stdout, done.stdout[-2000:]
    if ci == "true":
        assert done.returncode == 1 and "CI=true, and PostgreSQL's initdb" in done.stdout
    else:
        assert done.returncode == 0
