"""The rank count has one spelling, torchrun's: ``nproc_per_node`` ranks on each of ``nnodes``
nodes (``world_size`` is only ever their product). Every other spelling is refused with the new
name, and none is left in the CLI's help, the records' JSON keys or the plan grammar."""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.testing import CliRunner

from autotune.api._common import tune_records
from autotune.cli import COMMANDS, app
from autotune.records import AutotuneError, Plan, parse_plan

OLD = ("gpus", "gpus_per_node", "nodes", "nproc")
"""Spellings retired for ranks per node and nodes."""
runner = CliRunner()


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_offers_an_old_spelling(command: str) -> None:
    shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", shown.stdout))
    retired = {f"--{name.replace('_', '-')}" for name in (*OLD, "world_size")}
    assert not flags & retired
    if command not in ("report",):  # every command that places ranks names them torchrun's way
        assert {"--nproc-per-node", "--nnodes"} <= flags or command in ("profile", "confirm")


def _keys(schema: Any) -> set[str]:
    """Every property name in a JSON schema, however deep."""
    found: set[str] = set()
    if isinstance(schema, dict):
        found |= set(schema.get("properties", {}))
        for value in schema.values():
            found |= _keys(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _keys(value)
    return found


def test_no_record_has_an_old_key() -> None:
    from autotune.estimator import EstimateRecord
    from autotune.policy import SuggestRecord
    from autotune.records import ProfileRecord, Recommendation, TrialResult, WorkerSpec
    from autotune.search import TuneRecord

    records = (Plan, ProfileRecord, EstimateRecord, SuggestRecord, TuneRecord, Recommendation,
               TrialResult, WorkerSpec)  # fmt: skip
    keys = set().union(*(_keys(record.model_json_schema()) for record in records))
    assert {"nproc_per_node", "nnodes"} <= keys
    assert not keys & set(OLD)


@pytest.mark.parametrize("old", ["gpus=2", "gpus_per_node=2", "nodes=2", "world_size=4"])
def test_the_plan_grammar_refuses_an_old_spelling_naming_the_new(old: str) -> None:
    with pytest.raises(AutotuneError) as refused:
        parse_plan(f"stage=2,{old}")
    key = old.split("=")[0]
    new = "nnodes" if key == "nodes" else "nproc_per_node"
    assert str(refused.value).startswith(f"--plan: {key}: renamed to {new}")


@pytest.mark.parametrize(("old", "new"), [("gpus_per_node", "nproc_per_node"), ("nodes", "nnodes")])
def test_a_record_with_an_old_key_is_refused_naming_the_new(old: str, new: str) -> None:
    with pytest.raises(ValueError, match=f"{old}: renamed to {new}"):
        Plan.model_validate({"micro_batch": 2, old: 2})


@pytest.mark.parametrize("old", ["nproc", "gpus_per_node", "nodes", "world_size"])
def test_the_python_api_refuses_an_old_spelling(old: str) -> None:
    with pytest.raises(AutotuneError, match=f"^tune: {old}: renamed to n"):
        tune_records(None, None, {"global_batch": 8, old: 2})
    tuned, machine = tune_records(None, None, {"global_batch": 8, "nproc_per_node": 2,
                                               "nnodes": 2})  # fmt: skip
    assert tuned.global_batch == 8 and machine.world_size == 4
