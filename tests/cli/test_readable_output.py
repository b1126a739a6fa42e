"""What a user reads: suggest restates the budget and its usable part, names its evidence in
words and a precision switch a rule makes; config printed to stdout still shows the world size
and the code changes (on stderr, so the JSON pipes alone); the estimate's comm column has a unit."""

from __future__ import annotations

import json
from pathlib import Path

from _profiles import synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()
GiB = 2**30


def _profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(synthetic_profile(parameters=1_000_000_000, layers=16).model_dump_json())
    return path


def test_suggest_restates_the_budget_and_speaks_in_words(tmp_path: Path) -> None:
    args = ["suggest", str(_profile(tmp_path)), "--device-memory", "20GiB", "--margin", "0.2",
            "--nproc-per-node", "8", "--global-batch", "64"]  # fmt: skip
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    # 20 GiB less 20 %: 16 GiB, computed here
    assert "budget: 20.00 GiB per device (given); usable 16.00 GiB after the 20% margin" in (
        shown.stdout
    )
    record = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    names = {name for item in record["suggestions"] for name in item["evidence"]}
    evidence = [line for line in shown.stdout.splitlines() if line.strip().startswith("evidence:")]
    assert evidence and names
    for name in {n for n in names if "_" in n}:  # internal names stay in --json only
        assert not any(name in line for line in evidence), name
    assert not any("=" in line.split(":", 1)[1] for line in evidence)
    assert "(formula)" not in shown.stdout
    switches = [
        (before, item)
        for before, item in zip(
            [{"plan": record["baseline"]}, *record["suggestions"]],
            record["suggestions"],
            strict=False,
        )
        if before["plan"]["precision"].startswith("amp_")
        and not item["plan"]["precision"].startswith("amp_")
    ]
    for before, item in switches:
        assert f"note: precision {before['plan']['precision']} -> {item['plan']['precision']}" in (
            shown.stdout
        )


def test_config_to_stdout_keeps_the_world_size_and_the_code_changes() -> None:
    plan = "stage=2,mb=4,ga=8,ckpt=2,nproc_per_node=2"
    shown = runner.invoke(app, ["config", "--plan", plan])
    assert shown.exit_code == 0, shown.output
    config = json.loads(shown.stdout)  # stdout is the JSON alone
    world = config["train_batch_size"] // (4 * 8)
    assert world == 2
    assert "x world size 2;" in shown.stderr
    assert "activation checkpointing of the first 2 blocks" in shown.stderr


def test_the_estimate_comm_column_has_its_unit(tmp_path: Path) -> None:
    shown = runner.invoke(app, ["estimate", "--profile", str(_profile(tmp_path)), "--plan",
                                "stage=2", "--nproc-per-node", "8"], env={"COLUMNS": "200"})  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert "comm/step" in shown.stdout
    assert "every size in GiB: per device, host RAM per node, bytes communicated per step" in (
        " ".join(shown.stdout.split())
    )


def test_every_fact_a_rule_can_cite_has_words() -> None:
    from autotune.cli.suggest import _LABELS
    from autotune.policy import FACT_KINDS, Facts

    plan_knobs = {"precision", "checkpoint_blocks", "micro_batch", "grad_accum", "global_batch",
                  "zero_stage", "offload_optimizer", "offload_param", "attention", "compile",
                  "dataloader_workers", "pin_memory"}  # fmt: skip
    facts = set(Facts.model_fields) - {"plan", "sources"}
    assert facts <= set(FACT_KINDS) | plan_knobs
    missing = sorted((facts | set(FACT_KINDS) | plan_knobs) - set(_LABELS))
    assert not missing
