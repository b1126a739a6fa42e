"""Trials over nodes: the agents' reports merged (pure), and the one-line failures a cluster
user meets (wrong hostname, missing endpoint, versions that differ between nodes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import AutotuneError
from autotune.search import TrialResult, parse_endpoint, versions
from autotune.search._agents import merge_reports, run_job
from autotune.search._outcome import classify_outcome, outcome_reason

JOB = {"id": "j1", "nnodes": 2, "rdzv_endpoint": "127.0.0.1:29400", "join_timeout": 30.0}


def _report(host: str, returncode: int = 0, steps: int = 2, tail: str = "") -> dict[str, Any]:
    result = TrialResult(completed_steps=steps, samples_per_s=5.0, peak_memory_bytes=[1, 2])
    return {"host": host, "returncode": returncode, "timed_out": False,
            "result": result.model_dump(mode="json") if steps else None,
            "stderr_tail": tail, "duration_s": 3.0}  # fmt: skip


def _classified(reports: list[dict[str, Any]]) -> tuple[str, str | None]:
    run = merge_reports(reports, JOB, 3.0)
    outcome = classify_outcome(run.returncode, run.timed_out, run.result, run.stderr_tail)
    return outcome, outcome_reason(outcome, run.result, run.stderr_tail)


def test_both_nodes_ok_is_ok() -> None:
    assert _classified([_report("a"), _report("b")]) == ("ok", None)


def test_a_node_that_never_joined_is_a_timeout_that_names_the_rendezvous() -> None:
    tail = "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    outcome, reason = _classified([_report("a", returncode=1, steps=0, tail=tail)])
    assert outcome == "timeout"
    assert (
        reason is not None
        and "1 of 2 node(s) never joined the rendezvous at 127.0.0.1:29400" in reason
    )
    assert "nodes that did: a" in reason


def test_a_crash_on_one_node_is_a_crash_with_its_stderr() -> None:
    outcome, reason = _classified(
        [_report("a"), _report("b", returncode=1, steps=0, tail="RuntimeError: boom")]
    )
    assert outcome == "crash" and reason == "[b] RuntimeError: boom"  # which node failed


def test_versions_that_differ_stop_the_launch_with_one_line(tmp_path: Path) -> None:
    job = {**JOB, "versions": {**versions(), "torch": "0.0.1"}, "plan": {}, "settings": {}}
    report = run_job(job, str(tmp_path))
    assert report["returncode"] == 2 and report["result"] is None
    assert report["stderr_tail"].startswith(
        "autotune: versions differ between nodes: torch 0.0.1 on the asker"
    )
    outcome = classify_outcome(2, False, None, report["stderr_tail"])
    assert outcome == "crash" and "versions differ" in (
        outcome_reason(outcome, None, report["stderr_tail"]) or ""
    )


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("no-such-host.invalid:29400", "cannot resolve host 'no-such-host.invalid'"),
        ("node0", "expected HOST:PORT"),
        ("node0:http", "expected HOST:PORT"),
    ],
)
def test_bad_endpoints_are_refused(endpoint: str, message: str) -> None:
    with pytest.raises(AutotuneError, match=message):
        parse_endpoint(endpoint)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nnodes", "2"], "--nnodes 2: give --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29400"], "cannot resolve host"),
        (
            ["--nnodes", "3"],
            "global_batch (--global-batch) 4 does not split over nproc_per_node (--nproc-per-node) 1 x nnodes (--nnodes) 3",
        ),
        (["--heartbeat", "0"], "--heartbeat-s: must be >= 1 (got 0)"),
    ],
)
def test_cluster_flags_fail_in_one_line_before_any_work(
    extra: list[str],
    message: str,
    examples_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    model = str(examples_dir / "mlp_dataloader.py")
    result = CliRunner().invoke(app, ["tune", model, "--global-batch", "4", *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_agent_on_an_unreachable_database_says_so_in_one_line() -> None:
    result = CliRunner().invoke(
        app, ["agent", "--storage", "postgresql://u@127.0.0.1:1/db", "--study", "s"]
    )
    assert result.exit_code == 2, result.output
    assert "cannot open the study: OperationalError" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_an_agent_started_before_its_study_says_what_it_waits_for_and_until_when(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    result = CliRunner().invoke(
        app, ["agent", "--storage", url, "--study", "s", "--idle-timeout", "1"]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [
        f"autotune agent: study s is not in {url} yet (the asker, autotune tune, creates it "
        "after profiling): waiting up to 1 s",
        f"autotune: --study s: not in {url} after 1 s",
    ]
