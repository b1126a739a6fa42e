"""What a newcomer meets: tune's log lines off a terminal, its output folder made, confirm on
the profile's device, and a Python API that keeps its docstrings' promises."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
from _profiles import synthetic_profile
from _search import FakePool
from typer.testing import CliRunner

import autotune
from autotune import api
from autotune.cli import app
from autotune.records import AutotuneError, NotApplicable, Plan, write_record

GiB = 2**30


def _tune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out_dir: Path) -> Any:
    monkeypatch.setattr("autotune.api._tune.PoolRunner", FakePool)
    model = tmp_path / "model.py"
    model.write_text("# never imported: the fake runner does not build it\n")
    profile = write_record(tmp_path / "p.json", synthetic_profile(device="cpu", bf16_ratio=0.5))
    args = ["tune", str(model), "--global-batch", "8", "--profile", str(profile),
            "--device", "cpu", "--device-memory", "64GiB", "--trials", "3", "--repeats", "0",
            "--storage", str(tmp_path / "s.db"), "--out-dir", str(out_dir)]  # fmt: skip
    return CliRunner().invoke(app, args)


def test_off_a_terminal_tune_logs_a_line_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _tune(tmp_path, monkeypatch, tmp_path / "out")
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "out" / "autotune-tune.json").read_text())
    decided = [t for t in record["trials"] if t["state"] in ("complete", "pruned", "failed")]
    lines = [
        line for line in result.stderr.splitlines() if line.startswith("autotune tune: trial ")
    ]
    # One line per decided trial, each naming the plan and its outcome, in the study's order.
    assert len(lines) == len(decided)
    for line, trial in zip(lines, decided, strict=True):
        plan = Plan.model_validate(trial["plan"]).describe()
        assert f"trial {trial['number']} " in line and plan in line
        assert (trial["outcome"] or "pruned") in line
    # The first line says what the start-up waits for, before any trial.
    first = result.stderr.splitlines()[0]
    assert first.startswith("autotune tune: starting the trial workers")


def test_tune_creates_its_out_dir_and_writes_the_record_report_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "runs" / "today"
    result = _tune(tmp_path, monkeypatch, out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "autotune-tune.json", "ds_config.json", "recommendation.json",
    ]  # fmt: skip
    report = CliRunner().invoke(app, ["report", "--tune", str(out / "autotune-tune.json"),
                                      "--out", str(tmp_path / "r.html")])  # fmt: skip
    assert report.exit_code == 0, report.output
    # A path that is a file cannot be the folder: refused before any work, nothing made.
    blocker = tmp_path / "file"
    blocker.write_text("")
    refused = _tune(tmp_path, monkeypatch, blocker / "sub")
    assert refused.exit_code == 2 and "--out-dir" in refused.stderr
    assert blocker.is_file()


def test_confirm_measures_on_the_device_the_profile_ran_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices: list[str] = []

    def measure(model_file: Any, before: Plan, after: Plan, *, device: str, **_: Any) -> Any:
        devices.append(device)
        raise NotApplicable("fake: nothing measured here")

    monkeypatch.setattr("autotune.runtime.ab.measure", measure)
    monkeypatch.setattr("autotune.runtime.modelfile.load_model_file", lambda path: None)
    model = tmp_path / "model.py"
    model.write_text("")
    profile = synthetic_profile(device="cuda", batch_size=8)
    record = api.confirm(model, batch_size=8, profile=profile, max_changes=2)
    assert record.device == "cuda"
    assert devices and set(devices) == {"cuda"}


def test_the_python_api_refuses_what_a_mode_ignores_and_reads_units(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="trials apply to search=True only"):
        autotune.recommend("model.py", global_batch=8, trials=3)
    with pytest.raises(AutotuneError, match="unknown option 'trails'"):
        api.tune_records(None, None, {"global_batch": 8, "trails": 3})
    options, machine = api.tune_records(
        None,
        None,
        {"global_batch": 8, "nproc_per_node": 2, "device_memory": "80GiB", "margin": 0.2},
    )
    assert machine.device_memory == 80 * GiB and machine.nproc_per_node == 2
    assert machine.usable == pytest.approx(0.8 * 80 * GiB)
    assert options.global_batch == 8


def test_the_apis_docstrings_name_only_what_exists() -> None:
    # Every ``name(...)`` / :func:`name` / :meth:`X.name` a public function's docstring
    # promises can be called.
    for name in ("recommend", "tune", "deepspeed_config", "fsdp2_config"):
        doc = inspect.getdoc(getattr(autotune, name)) or ""
        for ref in re.findall(r":(?:func|meth):`~?([\w.]+)`", doc):
            assert _resolves(ref), f"{name}'s docstring names {ref}, which does not exist"
        for call in re.findall(r"\brec\.(\w+)\(", doc):
            assert hasattr(autotune.Recommendation, call), f"{name}: rec.{call}() does not exist"


def _resolves(ref: str) -> bool:
    """Whether a dotted name from a docstring is an attribute of autotune, its API or records."""
    import importlib

    import autotune.records as records
    import autotune.search as search

    module, _, attr = ref.rpartition(".")
    if module.startswith("autotune"):  # fully qualified: import the module, find the name
        return hasattr(importlib.import_module(module), attr)
    head, *rest = ref.split(".")
    for root in (autotune, api, records, search):
        value: Any = getattr(root, head, None)
        for part in rest:
            value = getattr(value, part, None)
        if value is not None:
            return True
    return False


def test_the_readmes_python_block_calls_only_what_autotune_has() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    called = set(re.findall(r"\bautotune\.(\w+)", block))
    assert {"recommend", "hf_training_arguments", "deepspeed_config", "tune"} <= called
    assert [name for name in called if name not in autotune.__all__] == []


def test_tune_takes_the_head_from_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # BERT's config names its masked-LM head; --task picks another for the same config.
    monkeypatch.setattr("autotune.api._tune.PoolRunner", FakePool)
    config = Path(__file__).resolve().parents[2] / "examples" / "zoo" / "bert.json"
    args = ["tune", "--hf-config", str(config), "--seq-len", "16", "--task",
            "sequence-classification", "--global-batch", "4", "--device", "cpu", "--trials", "1",
            "--repeats", "0", "--storage", str(tmp_path / "s.db"), "--out-dir", str(tmp_path),
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert "--task sequence-classification" in record["model_file"]
