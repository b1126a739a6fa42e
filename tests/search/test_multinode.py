"""Two nodes simulated on localhost: two `autotune agent`s, one rank each, form 2-rank ZeRO-2
trials through torchrun's c10d rendezvous, with the study in PostgreSQL; and a node that never
joins makes a timeout that says so, without a stuck study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.search import storage_url
from autotune.search._runner import free_port

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def _agents(count: int, url: str, study: str, logs: Path) -> list[subprocess.Popen[bytes]]:
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for index in range(count):
        with (logs / f"agent{index}.log").open("wb") as err:
            cmd = [AUTOTUNE, "agent", "--storage", url, "--study", study, "--idle-timeout", "300"]
            procs.append(subprocess.Popen(cmd, stderr=err, env=ENV, cwd=logs))
    return procs


def _tune(
    model: Path, url: str, study: str, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        AUTOTUNE, "tune", str(model), "--global-batch", "8", "--nproc-per-node", "1", "--nnodes", "2",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--storage", url, "--study", study,
        "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
        "--out-dir", str(out), "--json", *extra,
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600, cwd=out)


def _stop(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=60))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes.append(None)
    return codes


def _reports(url: str, study: str) -> dict[str, list[dict[str, Any]]]:
    import optuna

    attrs = optuna.load_study(study_name=study, storage=storage_url(url)).user_attrs
    jobs: dict[str, list[dict[str, Any]]] = {}
    for key, value in attrs.items():
        if key.startswith("autotune:report:"):
            jobs.setdefault(key.split(":")[2], []).append(value)
    return jobs


@pytest.mark.slow
def test_two_agents_form_one_two_rank_zero2_trial(
    postgres_url: str, examples_dir: Path, tmp_path: Path
) -> None:
    from autotune.runtime.ds_validate import validate_with_deepspeed

    agents = _agents(2, postgres_url, "two-nodes", tmp_path / "logs")
    try:
        done = _tune(examples_dir / "mlp_dataloader.py", postgres_url, "two-nodes", tmp_path,
                     "--trials", "2", "--baseline", "stage=2,mb=4")  # fmt: skip
    finally:
        codes = _stop(agents)
    assert done.returncode == 0, done.stderr[-3000:]
    assert codes == [0, 0], "the agents did not exit when the asker ended the study"
    record = json.loads(done.stdout)
    assert record["nnodes"] == 2 and record["nproc_per_node"] == 1
    zero2 = [t for t in record["trials"] if t["plan"]["zero_stage"] == 2 and t["outcome"] == "ok"]
    assert zero2 and all(
        t["plan"]["nnodes"] == 2 and t["plan"]["nproc_per_node"] == 1 for t in zero2
    )
    # Every launch ran on both agents, and each saw a world of two ranks (one peak per rank).
    jobs = _reports(postgres_url, "two-nodes")
    trial_reports = [
        r
        for r in jobs.values()
        if any(x.get("result", {}) and x["result"].get("completed_steps") for x in r)
    ]
    assert len(trial_reports) >= 2
    for reports in trial_reports:
        assert len(reports) == 2 and all(r["returncode"] == 0 for r in reports)
        assert all(len(r["result"]["peak_memory_bytes"]) == 2 for r in reports)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    validate_with_deepspeed(config, world_size=2)  # DeepSpeed's own DeepSpeedConfig, 2 ranks
    assert config["train_batch_size"] == 8
    print("two nodes on localhost:", json.dumps({
        "trials": [(t["plan"]["zero_stage"], t["plan"]["nnodes"], t["outcome"], t["samples_per_s"]) for t in record["trials"]],
        "launches_on_both_agents": len(trial_reports), "recommendation": record["recommendation"]["plan"],
    }))  # fmt: skip


@pytest.mark.slow
def test_a_node_that_never_joins_times_out_and_the_search_goes_on(
    postgres_url: str, examples_dir: Path, tmp_path: Path
) -> None:
    agents = _agents(
        1, postgres_url, "one-node-missing", tmp_path / "logs"
    )  # the second never comes
    try:
        done = _tune(examples_dir / "mlp_dataloader.py", postgres_url, "one-node-missing", tmp_path,
                     "--trials", "2", "--join-timeout", "5")  # fmt: skip
    finally:
        codes = _stop(agents)
    assert done.returncode == 0, done.stderr[-3000:]
    assert codes == [0]
    record = json.loads(done.stdout)
    measured = [t for t in record["trials"] if t["outcome"] is not None]
    assert len(measured) == 2, "the search stopped after the first failed trial"
    for trial in measured:
        assert trial["outcome"] == "timeout" and trial["state"] == "failed"
        assert "1 of 2 node(s) never joined the rendezvous" in trial["reason"]
    # the asker said what it waited for while it waited
    assert ("of 2 node(s) took it; waiting up to 5 s (--join-timeout-s) for an agent (autotune "
            "agent --study one-node-missing) on each of the others") in done.stderr  # fmt: skip
    assert record["recommendation"] is None
