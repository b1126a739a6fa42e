"""Tables written to a pipe (no terminal: Rich assumes 80 columns) never cut a figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _profiles import synthetic_profile

from autotune.records import Plan, parse_plan
from autotune.search import TrialRecord, TuneRecord

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
WIDE = ["--all-plans", "--nproc-per-node", "8", "--nnodes", "4", "--train-tokens", "300B",
        "--mfu", "0.4", "--peak-tflops", "312"]  # fmt: skip


def _estimate(profile: Path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run([AUTOTUNE, "estimate", "--profile", str(profile), *WIDE, *extra],
                          capture_output=True, text=True, env=env,  # stdout is a pipe
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_estimate_table_through_a_pipe_shows_every_figure_whole(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(synthetic_profile(parameters=70_000_000_000, layers=80).model_dump_json())
    text = _estimate(profile)
    record = json.loads(_estimate(profile, "--json"))
    assert "…" not in text and "..." not in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == len(record["plans"])
    # --all-plans ranks the rows: each is matched to its plan by the plan column
    by_plan = {Plan.model_validate(plan["plan"]): plan for plan in record["plans"]}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("│").split("│")]
        precision, *knobs = cells[1].split()
        text = ",".join([f"precision={precision}", *knobs])
        plan = by_plan.pop(parse_plan(text, Plan(nproc_per_node=8, nnodes=4)))
        memory = plan["memory"]
        # The table is in GiB here (the largest peak is over 1 GiB), two decimals.
        assert cells[6] == f"{memory['peak'] / 2**30:.2f}"
        assert cells[4] == f"{memory['optimizer_states'] / 2**30:.2f}"
        # a GPU profile's grid has offload plans: their host RAM per node is column 7
        assert cells[7] == f"{plan['host_bytes_per_node'] / 2**30:.2f}"
        assert cells[11] == f"{plan['communication_bytes_per_step'] / 2**30:.2f}"
        assert cells[12] == f"{plan['train_days']:.1f}"
    assert not by_plan


def test_tune_table_keeps_figures_whole_and_wraps_text(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli.tune import render

    reason = "predicted not to fit: " + "a long explanation of the budget " * 4
    trials = [TrialRecord(number=n, plan=Plan(micro_batch=2**n, grad_accum=2 ** (6 - n)),
                          state="complete", outcome="ok", samples_per_s=123456.789 * (n + 1),
                          tokens_per_s=987654321.0 * (n + 1), peak_memory_bytes=123456789012,
                          peak_source="cuda_max_allocated", predicted_peak_bytes=98765432109,
                          prediction_source="measured", reason=reason)
              for n in range(3)]  # fmt: skip
    record = TuneRecord(model_file="m.py", study="s", storage="sqlite:///s.db", global_batch=64,
                        nproc_per_node=1, device_memory=None, objective="tokens_per_s", trials=trials)  # fmt: skip
    render(record, [])
    text = capsys.readouterr().out
    assert "…" not in text
    for trial in trials:
        assert f"{trial.tokens_per_s:,.0f} tok/s" in text
