"""The machine's options through the CLI: one --margin and one default budget for the policy,
the estimate and the search alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from _profiles import synthetic_profile
from _search import FakePool
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import ProfileRecord, write_record

GiB = 2**30


def _profile(tmp_path: Path) -> tuple[Path, ProfileRecord]:
    # fp32 bf16-slow CPU profile: no precision change muddies what the budget decides.
    record = synthetic_profile(device="cpu", bf16_ratio=0.5, activations_per_sample=0.3 * 1e9)
    return write_record(tmp_path / "profile.json", record), record


def _suggest(path: Path, budget: int, margin: float) -> dict[str, Any]:
    args = ["suggest", str(path), "--device-memory", f"{budget}B", "--margin", str(margin),
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_margin_changes_what_suggest_proposes(tmp_path: Path) -> None:
    path, record = _profile(tmp_path)
    budget = int(record.memory.peak / 0.8)  # the measured peak is 80 % of the budget
    loose, tight = _suggest(path, budget, 0.1), _suggest(path, budget, 0.3)
    assert loose["margin"] == 0.1 and tight["margin"] == 0.3
    # 10 % free: the measured step fits (90 % > 80 %), nothing is changed to fit.
    assert loose["final_plan"]["checkpoint_blocks"] == 0
    assert loose["final_plan"]["micro_batch"] == record.config.batch_size
    # 30 % free: it does not (70 % < 80 %); the plan changes until its peak is under 70 %.
    first = tight["suggestions"][0]
    assert first["evidence"]["fits"]["value"] is False
    last = tight["suggestions"][-1]
    assert last["predicted"]["peak_bytes_after"] <= 0.7 * budget
    assert tight["final_plan"] != loose["final_plan"]


def _tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *extra: str) -> Any:
    monkeypatch.setattr("autotune.api._tune.PoolRunner", FakePool)
    model = tmp_path / "model.py"
    model.write_text("# never imported: the fake runner does not build it\n")
    path, _ = _profile(tmp_path)
    storage = tmp_path / f"{name}.db"
    args = ["tune", str(model), "--global-batch", "8", "--profile", str(path), "--device", "cpu",
            "--trials", "2", "--repeats", "0", "--storage", str(storage), "--study", name,
            "--out-dir", str(tmp_path / name), "--json", *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    trials = optuna.load_study(study_name=name, storage=f"sqlite:///{storage}").get_trials()
    return json.loads(result.stdout), {t.user_attrs.get("role"): t for t in trials}


def test_margin_changes_what_tunes_policy_enqueues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, record = _profile(tmp_path)
    budget = int(record.memory.peak / 0.8)
    _, loose = _tune(tmp_path, monkeypatch, "loose", "--device-memory", f"{budget}B")
    _, tight = _tune(tmp_path, monkeypatch, "tight", "--device-memory", f"{budget}B",
                     "--margin", "0.3")  # fmt: skip
    # 10 % free: the policy keeps the user's plan, which goes first as the baseline.
    assert "policy" not in loose
    # 30 % free: the policy's own plan goes first, predicted within 70 % of the budget.
    policy = tight["policy"]
    assert policy.number == 0
    assert policy.user_attrs["predicted_peak_bytes"] <= 0.7 * budget
    assert tight["baseline"].user_attrs["predicted_peak_bytes"] > 0.7 * budget


def test_the_cpu_default_budget_is_one_figure_for_policy_and_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, record = _profile(tmp_path)
    budget = int(record.memory.peak / 0.8)
    calls: list[int] = []

    def available() -> int:  # a machine whose free memory changes at every look
        calls.append(budget + len(calls) * GiB)
        return calls[-1]

    monkeypatch.setattr("autotune.records._machine.available_memory", available)
    seen: dict[str, Any] = {}
    from autotune.compose import _composition

    real_suggest = _composition.suggest

    def suggest(profile: ProfileRecord, **options: Any) -> Any:
        seen["policy"] = options["machine"].device_memory
        return real_suggest(profile, **options)

    monkeypatch.setattr(_composition, "suggest", suggest)
    tuned, trials = _tune(tmp_path, monkeypatch, "cpu", "--margin", "0.3")
    # Read once: the policy planned for the figure the search pruned against and reports.
    assert calls == [budget]
    assert seen["policy"] == tuned["device_memory"] == budget
    assert tuned["margin"] == 0.3  # the record says what the search kept free (the report reads it)
    assert trials["policy"].user_attrs["predicted_peak_bytes"] <= 0.7 * budget
