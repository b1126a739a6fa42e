"""Issue 34: a profile's impossible figures (MFU 161.2 %, bf16 56.74x fp32 on a CPU) are flagged,
and the advice never takes one as evidence."""

from __future__ import annotations

import json
from pathlib import Path

from _profiles import GB, synthetic_profile
from rich.console import Console
from typer.testing import CliRunner

from autotune.cli import app
from autotune.cli.profile import render
from autotune.estimator import BF16_RATIO_FIGURE, MFU_FIGURE, facts_from_profile
from autotune.policy import FactBuilder, SuggestRecord, suggest
from autotune.records import Machine, ProfileRecord, write_record

BUDGET = 1000 * GB
"""Everything fits: no rule proposes bf16 to save memory."""


def _profile(ratio: float, mfu: float, device: str = "cpu") -> ProfileRecord:
    base = synthetic_profile(device=device, bf16_ratio=ratio)
    return base.model_copy(update={"compute": base.compute.model_copy(update={"mfu": mfu})})


def _bf16_suggestions(record: SuggestRecord) -> list[str]:
    return [s.rule for s in record.suggestions if "bf16" in str(s.change.get("precision"))]


def test_a_possible_ratio_proposes_bf16_on_a_cpu() -> None:
    record = suggest(_profile(2.4, 0.4), device_memory=BUDGET)
    assert _bf16_suggestions(record) == ["mixed_precision"]
    evidence = record.suggestions[0].evidence["bf16_speed_ratio"]
    assert (evidence.value, evidence.source) == (2.4, "measured")
    assert not any("not used as evidence" in note for note in record.notes)


def test_an_impossible_ratio_on_a_cpu_is_unknown_and_proposes_nothing() -> None:
    profile = _profile(56.74, 1.612)
    record = suggest(profile, device_memory=BUDGET)
    assert _bf16_suggestions(record) == []
    builder = FactBuilder(profile, facts_from_profile(profile), Machine(device_memory=BUDGET))
    facts = builder.facts(builder.baseline)
    assert facts.bf16_speed_ratio is None and facts.source("bf16_speed_ratio") == "refused"
    assert facts.fast_bf16 is False
    notes = "\n".join(record.notes)
    assert BF16_RATIO_FIGURE in notes and "56.7x" in notes
    assert MFU_FIGURE in notes and "161.2%" in notes


def test_on_a_gpu_bf16_rests_on_the_capability_and_the_evidence_shows_the_ratio_unknown() -> None:
    # Ampere and later have bf16 tensor cores: that, not the impossible ratio, is the evidence.
    record = suggest(_profile(56.74, 0.4, device="cuda"))
    first = record.suggestions[0]
    assert first.rule == "mixed_precision" and first.change == {"precision": "amp_bf16"}
    ratio = first.evidence["bf16_speed_ratio"]
    assert ratio.value is None and ratio.source == "refused"


def test_suggest_json_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    for ratio, mfu, proposes in ((56.74, 1.612, False), (2.4, 0.4, True)):
        write_record(path, _profile(ratio, mfu))
        result = CliRunner().invoke(
            app, ["suggest", str(path), "--json", "--device-memory", "1000GB"]
        )
        assert result.exit_code == 0, result.output
        record = SuggestRecord.model_validate(json.loads(result.stdout))
        assert bool(_bf16_suggestions(record)) is proposes
        assert any(BF16_RATIO_FIGURE in note for note in record.notes) is not proposes
    result = CliRunner().invoke(app, ["suggest", str(path), "--device-memory", "1000GB"])
    assert "measured" in result.stdout and "refused" not in result.stdout
    write_record(path, _profile(56.74, 1.612, device="cuda"))
    result = CliRunner().invoke(app, ["suggest", str(path)])
    assert result.exit_code == 0, result.output
    assert "refused as impossible" in result.stdout and "not used as evidence" in result.stdout


def test_the_profile_table_marks_flagged_figures() -> None:
    console = Console(record=True, width=400)
    console.print(render(_profile(56.74, 1.612)))
    text = console.export_text()
    assert "161.2% (flagged)" in text and "impossible: MFU 161.2% > 100%" in text
    assert "bf16 matmuls at 56.74x fp32's speed (flagged, impossible" in text


def test_the_report_shows_an_old_record_s_impossible_mfu_as_flagged() -> None:
    from autotune.report._collect import profile_summary

    rows = dict(profile_summary(_profile(2.4, 1.612)))
    assert rows["MFU"].startswith("161.2% (flagged, impossible")
    assert dict(profile_summary(_profile(2.4, 0.4)))["MFU"].startswith("40.0% (measured")
