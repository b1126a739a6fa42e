"""Shared fixtures (examples, a real PostgreSQL server) and the GPU skip."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests where no CUDA device is visible."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def unavailable(reason: str) -> NoReturn:
    """Skip a test whose service (PostgreSQL, Chromium) cannot start here; under ``CI=true``,
    where ``.ci/run`` installs and starts them, fail instead: a skip there hides a broken set-up."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true, and {reason}", pytrace=False)
    pytest.skip(reason)


class ExitInTestProcess(BaseException):
    """``os._exit`` called in pytest's own process: it would end the run at once, with the code
    it was given (0 reads as a suite that passed), the tests after it never run. A
    ``BaseException``, so that an ``except Exception`` on the way does not hide it."""


@pytest.fixture(autouse=True, scope="session")
def _no_exit_in_the_test_process() -> Iterator[None]:
    """Code that leaves its process at once (a rank job's ``leave_ranks``) run in-process by a
    test raises :class:`ExitInTestProcess` instead; processes forked from this one (DataLoader
    workers, multiprocessing) exit as they would."""
    real, pid = os._exit, os.getpid()

    def guarded(code: int) -> NoReturn:
        if os.getpid() != pid:
            real(code)
        raise ExitInTestProcess(f"os._exit({code}) in pytest's process")

    os._exit = guarded
    yield
    os._exit = real


@pytest.fixture(autouse=True)
def _trace_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced HF-config facts go to the session's temporary folder, never the user's home."""
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def examples_dir() -> Path:
    """The repository's examples/ folder."""
    return EXAMPLES


def _as_nobody(cmd: list[str]) -> list[str]:
    # initdb refuses to run as root (as CI does): run the server as an unprivileged user.
    return ["runuser", "-u", "nobody", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """A real PostgreSQL server for the session (initdb + pg_ctl), stopped at the end.

    Yields the URL of its ``postgres`` database; skips where ``initdb`` is not on PATH.
    """
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        unavailable(
            "PostgreSQL's initdb/pg_ctl are not on PATH (Debian: apt-get install postgresql)"
        )
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("the postgres extra (psycopg) is not installed")
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-", dir="/tmp"))
    if os.geteuid() == 0:
        shutil.chown(base, "nobody")
    data, port = base / "data", _free_port()
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=120)
    try:
        run(_as_nobody(["initdb", "-D", str(data), "-U", "postgres", "--auth=trust"]))
        run(_as_nobody(["pg_ctl", "-D", str(data), "-l", str(base / "server.log"),
                        "-o", f"-p {port} -k {base}", "-w", "start"]))  # fmt: skip
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_nobody(["pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the session's server, for one test."""
    import psycopg

    # unique per test: a test's id cut short would name its parametrized twins' database too,
    # which an earlier twin's connections may still hold open (DROP then fails)
    readable = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40]
    name = f"t_{readable}_{hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.rsplit("/", 1)[0] + "/" + name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
