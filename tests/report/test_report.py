"""`autotune report`: page content from the data, figures, PNGs, bad input as one line."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_report_samples import (
    MiB,
    fill_study,
    make_confirm,
    make_profile,
    make_recommendation,
    make_study,
    make_suggestions,
    make_trials,
    make_tune,
)
from typer.testing import CliRunner

from autotune.cli import app
from autotune.records import AutotuneError, format_bytes, write_record
from autotune.report import ReportInputs, build_report, collect, pareto_front
from autotune.report._collect import trial_points
from autotune.report._study import MIN_TRIALS_FOR_IMPORTANCE, open_study

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NETWORK = re.compile(r"https?://|src=\"//|<script|<link|@import|url\(", re.IGNORECASE)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every input written as autotune's commands write them, plus a study in sqlite (read only)."""
    tmp_path = tmp_path_factory.mktemp("inputs")
    suggestions = make_suggestions()
    paths = {
        name: tmp_path / f"{name}.json" for name in ("profile", "suggest", "confirm", "tune", "rec")
    }
    write_record(paths["profile"], make_profile())
    write_record(paths["suggest"], suggestions)
    write_record(paths["confirm"], make_confirm(suggestions))
    write_record(paths["tune"], make_tune(storage=make_study(tmp_path / "tune.db")))
    write_record(paths["rec"], make_recommendation())
    return paths


def _invoke(*args: object) -> object:
    return CliRunner().invoke(app, ["report", *map(str, args)])


def test_profile_page_shows_its_numbers_and_figures() -> None:
    profile = make_profile()
    report = build_report(ReportInputs(profile=profile))
    page = report.html
    mem = profile.memory
    for value in (mem.parameters, mem.gradients, mem.optimizer_states, mem.activations, mem.peak):
        assert format_bytes(value) in page
    for phase in ("dataloader", "forward", "backward", "optimizer"):
        assert f"{getattr(profile.time, phase) * 1e3:.2f} ms" in page
    assert f"{profile.time.step * 1e3:.2f} ms" in page
    assert f"{profile.throughput.samples_per_s:,.2f} samples/s" in page
    assert all(item.module in page for item in mem.activations_by_module)
    assert set(report.figures) == {"memory", "blocks", "step"}
    for _caption, png in report.figures.values():
        assert png.startswith(PNG_MAGIC)
        assert base64.b64encode(png).decode() in page
    assert not NETWORK.search(page)


def test_full_page_has_every_section_and_no_network_reference(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out, png_dir = tmp_path / "report.html", tmp_path / "png"
    result = _invoke(files["profile"], "--suggestions", files["suggest"], "--confirm", files["confirm"],
                     "--tune", files["tune"], "--out", out, "--png-dir", png_dir, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    expected = ["memory", "blocks", "step", "changes", "trials", "importances"]
    assert record["figures"] == expected
    assert sorted(Path(p).name for p in record["png_files"]) == sorted(f"{n}.png" for n in expected)
    page = out.read_text()
    for name in expected:
        png = (png_dir / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC)
        assert f'id="fig-{name}"' in page and base64.b64encode(png).decode() in page
    assert set(record["sections"]) >= {
        "summary",
        "memory",
        "suggestions",
        "trials",
        "recommendation",
    }
    assert not NETWORK.search(page)
    assert not list(tmp_path.glob(".*.tmp")) and not list(png_dir.glob(".*.tmp"))


def test_trials_table_marks_outcomes_and_pareto_front() -> None:
    tune = make_tune()
    data = collect(ReportInputs(tune=tune))
    page = build_report(ReportInputs(tune=tune)).html
    assert {t.outcome for t in data.trials} == {"ok", "oom", "timeout", "crash", "pruned"}
    for trial in tune.trials:
        assert trial.plan.describe() in page
        if trial.samples_per_s is not None:
            assert f"{trial.samples_per_s:.2f}" in page
    front = [t.number for t in pareto_front(data.trials)]
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td>.*?</tr>", page)
    assert rows == [str(t.number) for t in tune.trials]
    for number in front:
        row = re.search(rf"<tr><td class=\"num\">{number}</td>(.*?)</tr>", page)
        assert row and "<td>yes</td>" in row.group(1)
    pruned = next(t for t in data.trials if t.outcome == "pruned")
    assert pruned.peak_memory_bytes == 1400 * MiB and "predicted" in pruned.note


@pytest.mark.parametrize(
    ("points", "front"),
    [
        ([(0, "ok", 10.0, 100), (1, "ok", 20.0, 200), (2, "ok", 15.0, 300)], [0, 1]),
        ([(0, "ok", 10.0, 100), (1, "ok", 10.0, 100)], [0]),
        ([(0, "oom", None, 50), (1, "ok", 5.0, 200), (2, "ok", 9.0, None)], [1]),
        ([(0, "pruned", None, 10), (1, "crash", None, None)], []),
        ([(0, "ok", 30.0, 300), (1, "ok", 20.0, 200), (2, "ok", 10.0, 100)], [2, 1, 0]),
    ],
)
def test_pareto_front(
    points: list[tuple[int, str, float | None, int | None]], front: list[int]
) -> None:
    from autotune.report._data import TrialPoint

    trials = [TrialPoint(n, "p", outcome, speed, peak) for n, outcome, speed, peak in points]  # type: ignore[arg-type]
    assert [t.number for t in pareto_front(trials)] == front


def test_trial_points_leave_out_running_trials_and_keep_oom_of_pruned() -> None:
    trials = make_trials()
    running = trials[0].model_copy(update={"number": 99, "state": "running", "outcome": None})
    pruned_oom = trials[4].model_copy(update={"number": 98, "state": "pruned"})
    points = trial_points([*trials, running, pruned_oom])
    assert [p.number for p in points] == [*(t.number for t in trials), 98]
    assert points[-1].outcome == "oom"


def test_suggestions_without_confirm_draw_a_bar_per_suggestion() -> None:
    profile, suggestions = make_profile(), make_suggestions()
    data = collect(ReportInputs(profile=profile, suggestions=suggestions))
    assert [bar.label for bar in data.memory_bars] == [
        "baseline",
        *(f"+ {s.rule}" for s in suggestions.suggestions),
    ]
    assert all(isinstance(bar.predicted_peak, int) for bar in data.memory_bars[1:])
    # Checkpointing two blocks must lower the activation bytes the estimate draws.
    assert data.memory_bars[1].parts["activations"] < data.memory_bars[0].parts["activations"]
    assert data.budget_bytes == suggestions.device_memory_bytes
    page = build_report(ReportInputs(profile=profile, suggestions=suggestions)).html
    for s in suggestions.suggestions:
        assert s.rule in page and s.reason in page
        for name, evidence in s.evidence.items():
            assert name in page and evidence.source in page
        assert format_bytes(s.predicted.peak_bytes_after) in page


def test_confirm_shows_measured_effect_and_only_kept_changes_get_bars() -> None:
    profile, suggestions = make_profile(), make_suggestions()
    confirm = make_confirm(suggestions)
    data = collect(ReportInputs(profile=profile, suggestions=suggestions, confirm=confirm))
    kept = [step for step in confirm.steps if step.status == "kept"]
    assert [bar.label for bar in data.memory_bars] == [
        "baseline",
        *(f"+ {s.rule} (kept)" for s in kept),
    ]
    assert data.memory_bars[1].measured_peak == kept[0].measured.peak_bytes_after  # type: ignore[union-attr]
    page = build_report(
        ReportInputs(profile=profile, suggestions=suggestions, confirm=confirm)
    ).html
    for step in confirm.steps:
        assert step.measured is not None
        assert f"×{step.measured.step_time_ratio:.2f}" in page and step.why in page
    assert [row.kept for row in data.suggestions] == [s.status == "kept" for s in confirm.steps]


def test_recommendation_rows_and_bar() -> None:
    rec = make_recommendation()
    data = collect(ReportInputs(profile=make_profile(), recommendation=rec))
    assert data.memory_bars[-1].label == "recommended"
    assert data.memory_bars[-1].measured_peak == rec.best.peak_memory_bytes  # type: ignore[union-attr]
    page = build_report(ReportInputs(recommendation=rec)).html
    assert rec.plan.describe() in page and f"{rec.speedup:.2f}×" in page
    assert rec.code_changes[0].what in page and rec.notes[0] in page


def test_trials_are_drawn_against_the_budget_tune_used() -> None:
    suggestions, tune = make_suggestions(budget=160 * MiB), make_tune()
    data = collect(ReportInputs(suggestions=suggestions, tune=tune))
    assert data.budget_bytes == 160 * MiB
    assert data.trial_budget_bytes == tune.device_memory
    page = build_report(ReportInputs(suggestions=suggestions, tune=tune)).html
    assert "judged against: 512 MiB (536.87 MB); usable part 460.80 MiB" in page  # x 0.9
    given = collect(ReportInputs(tune=tune, device_memory=64 * MiB))
    assert given.budget_bytes == given.trial_budget_bytes == 64 * MiB


def test_note_when_trial_and_profile_peaks_are_different_measures() -> None:
    tune = make_tune()
    best = tune.recommendation.plan  # type: ignore[union-attr]
    trials = [
        t.model_copy(update={"peak_source": "cpu_rss_delta"}) if t.plan == best else t
        for t in tune.trials
    ]
    mixed = tune.model_copy(update={"trials": trials})
    notes = collect(ReportInputs(profile=make_profile(), tune=mixed)).notes
    assert any("cpu_rss_delta" in n and "cpu_live_tensors" in n for n in notes)
    assert not any(
        "different measures" in n
        for n in collect(ReportInputs(profile=make_profile(), tune=tune)).notes
    )


def test_cpu_profile_draws_no_budget_unless_given() -> None:
    profile = make_profile(device_memory=24 * 2**30)
    assert collect(ReportInputs(profile=profile)).budget_bytes is None
    assert collect(ReportInputs(profile=profile, device_memory=300 * MiB)).budget_bytes == 300 * MiB
    assert "none known" in build_report(ReportInputs(profile=profile)).html


def test_importances_need_enough_completed_trials() -> None:
    import optuna

    enough = fill_study(optuna.create_study(direction="maximize"), MIN_TRIALS_FOR_IMPORTANCE)
    data = collect(ReportInputs(study=enough))
    assert data.importances is not None
    assert set(data.importances) == {"micro_batch", "checkpoint_blocks"}
    assert sum(data.importances.values()) == pytest.approx(1.0)
    few = fill_study(optuna.create_study(direction="maximize"), MIN_TRIALS_FOR_IMPORTANCE - 1)
    report = build_report(ReportInputs(study=few))
    assert "importances" not in report.figures
    assert any("importances skipped" in note for note in report.notes)
    assert "importances skipped" in report.html


def test_study_read_by_name_from_sqlite_url_and_plain_path(tmp_path: Path) -> None:
    url = make_study(tmp_path / "tune.db")
    for storage in (url, str(tmp_path / "tune.db")):
        result = _invoke(
            "--study", "tiny", "--storage", storage, "--out", tmp_path / "r.html", "--json"
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["figures"] == ["trials", "importances"]
    page = (tmp_path / "r.html").read_text()
    assert "oom" in page and format_bytes(900 * MiB) in page


def test_study_read_from_an_optuna_journal_file(tmp_path: Path) -> None:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "journal.log"
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    fill_study(optuna.create_study(study_name="j", storage=storage, direction="maximize"), 3)
    result = _invoke("--study", "j", "--storage", path, "--out", tmp_path / "r.html", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["figures"] == ["trials"]
    assert any("importances skipped: 3 completed" in note for note in record["notes"])


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "no such profile file"),
        ("not_json", "not valid JSON"),
        ("wrong_record", "not a valid profile: field"),
        ("nothing", "nothing to report"),
        ("study_alone", "--study and --storage go together"),
        ("study_and_tune", "either --tune or --study"),
        ("no_storage", "--storage: no such"),
        ("no_study", "no study 'other'"),
        ("out_dir", "does not exist"),
        ("bad_budget", "--device-memory"),
    ],
)
def test_bad_input_is_one_line(
    case: str, message: str, files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "r.html"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    db = str(files["tune"].parent / "tune.db")
    args = {
        "missing": [tmp_path / "nope.json", "--out", out],
        "not_json": [bad, "--out", out],
        "wrong_record": [files["tune"], "--out", out],
        "nothing": ["--out", out],
        "study_alone": ["--study", "tiny", "--out", out],
        "study_and_tune": [
            "--study",
            "tiny",
            "--storage",
            db,
            "--tune",
            files["tune"],
            "--out",
            out,
        ],
        "no_storage": ["--study", "tiny", "--storage", tmp_path / "none.db", "--out", out],
        "no_study": ["--study", "other", "--storage", db, "--out", out],
        "out_dir": [files["profile"], "--out", tmp_path / "no" / "r.html"],
        "bad_budget": [files["profile"], "--device-memory", "lots", "--out", out],
    }[case]
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: ") and message in lines[0]
    assert not out.exists()
    if case == "no_storage":
        assert not (tmp_path / "none.db").exists()


@pytest.mark.slow
def test_report_never_imports_torch(files: dict[str, Path], tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from autotune.cli import app\n"
        f"app(['report', {str(files['profile'])!r}, '--confirm', {str(files['confirm'])!r},"
        f" '--suggestions', {str(files['suggest'])!r}, '--out', {str(tmp_path / 'r.html')!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").is_file()


def test_a_tune_records_wall_time_is_in_the_summary() -> None:
    from autotune.search._records import WallTime

    wall = WallTime.of(total_s=451.3, profile_s=104.2, startup_s=7.2, trials_s=335.1,
                       comparison_s=0.0)  # fmt: skip
    tune = make_tune().model_copy(update={"wall_time": wall})
    summary = dict(collect(ReportInputs(tune=tune)).summary)
    assert summary["tune wall time"] == wall.describe()
    assert "7 min 31 s" in summary["tune wall time"]
    assert "tune wall time" not in dict(collect(ReportInputs(tune=make_tune())).summary)
    assert wall.describe() in build_report(ReportInputs(tune=tune)).html


def test_a_missing_study_lists_the_studies_there_but_not_tunes_markers(tmp_path: Path) -> None:
    import optuna

    url = f"sqlite:///{tmp_path / 's.db'}"
    for name in ("tiny", "tiny:took-trial:3", "tiny:final-comparison:0a1b-1r", "big"):
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(AutotuneError) as err:
        open_study("other", str(tmp_path / "s.db"))
    assert str(err.value).endswith("(studies there: tiny, big)")
