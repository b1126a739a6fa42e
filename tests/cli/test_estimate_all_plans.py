"""`autotune estimate --all-plans`: a plan column, the plans that fit first by predicted speed,
the best marked, and ``--top N``; checked against the JSON record of the same estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _profiles import synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import Plan, parse_plan

runner = CliRunner()
# 3 precisions x 4 ZeRO stages x 3 checkpointings x 4 micro-batches, and on this GPU profile
# bf16 ZeRO-Offload at stages 2 and 3 and ZeRO-3 parameter offload x 3 x 4
GRID = 3 * 4 * 3 * 4 + 3 * 3 * 4


@pytest.fixture(scope="module")
def args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("estimate") / "profile.json"
    path.write_text(synthetic_profile(parameters=7_000_000_000, layers=32).model_dump_json())
    return ["estimate", "--profile", str(path), "--all-plans", "--nproc-per-node", "8",
            "--device-memory", "80GiB"]  # fmt: skip


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("│")]
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in lines]


def _plan(cell: str) -> Plan:
    """The plan column read back with the library's parser (precision first, then knobs)."""
    precision, *knobs = cell.split()
    return parse_plan(",".join([f"precision={precision}", *knobs]), Plan(nproc_per_node=8))


def _speed(estimate: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """Samples per step over the reference's, over the predicted step-time ratio."""
    ratio = estimate["predicted_step_time_ratio"]
    if ratio is None:
        return None
    plan = estimate["plan"]

    def samples(p: dict[str, Any]) -> int:
        return p["micro_batch"] * p["grad_accum"] * p["nproc_per_node"] * p["nnodes"]

    return samples(plan) / samples(reference) / float(ratio)


def test_the_plans_that_fit_come_first_by_predicted_speed_and_the_best_is_marked(
    args: list[str],
) -> None:
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    record = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    rows = _rows(shown.stdout)
    assert len(rows) == len(record["plans"]) == GRID
    by_plan = {Plan.model_validate(e["plan"]): e for e in record["plans"]}
    estimates = [by_plan[_plan(row[1])] for row in rows]  # every row names its plan
    assert len({id(e) for e in estimates}) == len(rows)
    fits = [e["fits"] for e in estimates]
    assert fits == sorted(fits, reverse=True) and True in fits and False in fits
    reference = record["baseline"]
    speeds = [_speed(e, reference) for e in estimates if e["fits"]]
    known = [s for s in speeds if s is not None]
    assert known and speeds[: len(known)] == known  # unknown speeds after known ones
    assert known == sorted(known, reverse=True)
    assert [row[0] for row in rows] == ["*"] + [""] * (len(rows) - 1)
    # best, plan, params, grads, optim, act, peak, host/node, fits, s/step, samples/s/dev
    first = estimates[0]
    per_device = first["plan"]["micro_batch"] * first["plan"]["grad_accum"]
    assert rows[0][9] == f"{first['predicted_step_seconds']:.3g}"
    assert rows[0][10] == f"{per_device / first['predicted_step_seconds']:.3g}"
    assert max(known) == known[0]
    assert f"* best: {Plan.model_validate(estimates[0]['plan']).describe()}" in shown.stdout


def test_top_shows_the_first_rows(args: list[str]) -> None:
    full = _rows(runner.invoke(app, args).stdout)
    top = runner.invoke(app, [*args, "--top", "5"])
    assert top.exit_code == 0, top.output
    assert _rows(top.stdout) == full[:5]
    assert f"showing the first 5 of {GRID} plans (--top)" in top.stdout
    bad = runner.invoke(app, [*args, "--top", "0"])
    assert bad.exit_code == 2 and "--top" in bad.stderr


@pytest.mark.parametrize(
    ("given", "shown"),
    # 80 x 1024**3 = 85.90e9 bytes; 80e9 bytes = 74.51 x 1024**3
    [("80GiB", "device memory 80 GiB (85.90 GB)"), ("80GB", "device memory 80 GB (74.51 GiB)")],
)
def test_the_budget_shows_in_the_unit_given_with_the_other_beside(
    args: list[str], given: str, shown: str
) -> None:
    result = runner.invoke(app, [*args[:-1], given, "--top", "1"])
    assert result.exit_code == 0, result.output
    assert shown in " ".join(result.stdout.split())


def test_a_bare_number_is_refused_with_one_line(args: list[str]) -> None:
    result = runner.invoke(app, [*args[:-1], "80"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "autotune: --device-memory 80: give a unit, e.g. 80GiB or 80GB"


SEVENTY_B = ["estimate", "--hf-config", "examples/configs/llama3_70b.json", "--seq-len", "4096",
             "--batch-size", "1", "--nproc-per-node", "8", "--nnodes", "4", "--all-plans"]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "judged"), [("cpu", True), ("cuda", False)], ids=["this-cpu", "a-gpu-not-here"]
)
def test_without_a_budget_no_plan_over_the_default_device_is_marked_best(
    device: str, judged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a 70B model on 4 x 8 devices with no --device-memory once marked fp32
    micro-batch 1 without ZeRO best at 1059 GiB per device. The budget is now the default
    device's (this CPU's available memory, independently read here), and where none is known
    (a GPU this machine lacks) nothing is marked best."""
    import psutil

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    if device == "cuda":
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    shown = runner.invoke(app, [*SEVENTY_B, "--device", device])
    assert shown.exit_code == 0, shown.output
    record = json.loads(runner.invoke(app, [*SEVENTY_B, "--device", device, "--json"]).stdout)
    by_plan = {Plan.model_validate(e["plan"]): e for e in record["plans"]}
    starred = [row for row in _rows(shown.stdout) if row[0] == "*"]
    if not judged:
        assert record["device_memory_bytes"] is None and not starred
        assert "no plan is marked best" in shown.stdout
        return
    available = psutil.virtual_memory().available
    assert record["budget_source"] == "available_ram"
    assert abs(record["device_memory_bytes"] - available) < 0.2 * available
    for row in starred:
        estimate = by_plan[_plan(row[1]).with_changes(nnodes=4)]
        assert estimate["memory"]["peak"] <= record["device_memory_bytes"] * (1 - record["margin"])
    fp32_plain = next(e for p, e in by_plan.items() if p.precision == "fp32" and p.zero_stage == 0
                      and p.micro_batch == 1 and p.checkpoint_blocks == 0)  # fmt: skip
    assert fp32_plain["fits"] is False


def test_each_plans_communication_seconds_sit_in_its_row_and_the_link_is_named_once(
    args: list[str],
) -> None:
    """On a given link every plan's communication time is a column of its own row (the JSON's
    ``communication_seconds``), and the link's source is one note, not one unnamed line a plan."""
    linked = [*args, "--inter-gbps", "10", "--nnodes", "2", "--top", "6"]
    shown = runner.invoke(app, linked)
    assert shown.exit_code == 0, shown.output
    record = json.loads(runner.invoke(app, [*linked, "--json"]).stdout)
    header = next(line for line in shown.stdout.splitlines() if line.startswith("┃"))
    assert header.strip("┃").split("┃")[-1].strip() == "comm s"
    by_plan = {Plan.model_validate(e["plan"]): e["communication_seconds"] for e in record["plans"]}
    rows = _rows(shown.stdout)
    assert len(rows) == 6
    for row in rows:
        expected = by_plan[_plan(row[1]).with_changes(nnodes=2)]
        assert expected is not None and float(row[-1]) == pytest.approx(expected, rel=5e-3)
    notes = [line for line in shown.stdout.splitlines() if line.startswith("note: communication")]
    assert notes == ["note: communication timed on the given --inter-gbps"]
