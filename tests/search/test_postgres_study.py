"""The study in PostgreSQL: run_tune() on it, optuna-dashboard opening it, and one-line errors."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from _search import run_tune

from autotune.records import AutotuneError, Plan
from autotune.search import TrialResult, TrialSettings, open_study, storage_url
from autotune.search._runner import FakeRunner


def _fast(plan: Plan, settings: TrialSettings) -> TrialResult:
    return TrialResult(
        completed_steps=2, samples_per_s=10.0 + plan.micro_batch, peak_memory_bytes=[1]
    )


def test_tune_on_postgres_and_the_dashboard_opens_it(postgres_url: str, tmp_path: Path) -> None:
    settings = TrialSettings(model_file="m.py", timeout_s=5)
    record = run_tune("m.py", global_batch=8, settings=settings, runner=FakeRunner(_fast), blocks=1,
                  trials=3, storage=postgres_url, study_name="dash", repeats=0, heartbeat_s=1)  # fmt: skip
    assert record.storage.startswith("postgresql+psycopg://")
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    from optuna_dashboard import wsgi

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = make_server("127.0.0.1", 0, wsgi(storage_url(postgres_url)), handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{server.server_port}/api/studies"
    try:
        summaries = _get(address)["study_summaries"]
        study_id = next(s["study_id"] for s in summaries if s["study_name"] == "dash")
        trials = _get(f"{address}/{study_id}?after=0")["trials"]
    finally:
        server.shutdown()
        server.server_close()
    # The dashboard shows every trial tune stored, with the plan autotune attached.
    assert len(trials) == len(record.trials)
    assert all(any(a["key"] == "plan" for a in t["user_attrs"]) for t in trials)


def _get(address: str) -> dict[str, Any]:
    with urllib.request.urlopen(address, timeout=30) as response:
        return dict(json.loads(response.read()))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgresql://postgres@no-such-host.invalid:5432/db",
            "cannot open the study: OperationalError",
        ),
        ("postgresql://postgres@127.0.0.1:1/db", "cannot open the study: OperationalError"),
    ],
)
def test_unreachable_database_is_one_line(url: str, message: str) -> None:
    with pytest.raises(AutotuneError) as caught:
        open_study(url, "s")
    text = str(caught.value)
    assert (
        message in text and "\n" not in text and text.startswith("--storage postgresql+psycopg://")
    )


def test_a_journal_file_is_refused_for_tune(tmp_path: Path) -> None:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "journal.log"
    optuna.create_study(storage=optuna.storages.JournalStorage(JournalFileBackend(str(path))))
    with pytest.raises(AutotuneError, match="not a sqlite database"):
        open_study(str(path), "s")
