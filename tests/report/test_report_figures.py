"""The report's figures agree with the records: bars end at the peak they stand for, are named
by their plan and ranks, and the trials figure draws its Pareto front and the usable budget."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from test_report_samples import MiB, make_profile, make_trials, make_tune

from autotune.records import Plan
from autotune.report import ReportInputs, collect
from autotune.report._figures import memory_figure, trials_figure
from autotune.search import TrialRecord

GiB = 1024 * MiB


def _bar_tops(fig: Figure) -> list[float]:
    """The top of each stacked bar as drawn, left to right (axis units)."""
    tops: dict[float, float] = defaultdict(float)
    for patch in fig.axes[0].patches:
        assert isinstance(patch, Rectangle)
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        tops[x] = max(tops[x], patch.get_y() + patch.get_height())
    return [tops[x] for x in sorted(tops)]


def _tune_with_baseline() -> object:
    """make_tune's trials plus the user's baseline plan (2 ranks, micro-batch 4), pruned."""
    baseline = TrialRecord(
        number=8, plan=Plan(micro_batch=4, nproc_per_node=2), role="baseline", state="pruned",
        predicted_peak_bytes=300 * MiB, prediction_source="formula",
        reason="predicted out of memory",
    )  # fmt: skip
    tune = make_tune()
    return tune.model_copy(update={"trials": [*tune.trials, baseline]})


def test_the_profile_bar_is_what_was_live_at_the_measured_peak_and_ends_there() -> None:
    profile = make_profile()
    bar = collect(ReportInputs(profile=profile)).memory_bars[0]
    # make_profile's at_peak: 37 + 21 + 74 + 55 MiB, other = buffers 1 + temporaries 3 MiB
    assert bar.parts == {"parameters": 37 * MiB, "gradients": 21 * MiB,
                         "optimizer_states": 74 * MiB, "activations": 55 * MiB,
                         "other": 4 * MiB}  # fmt: skip
    assert bar.height == profile.memory.peak == 191 * MiB
    assert (bar.label, bar.plan, bar.ranks) == ("baseline", "precision=fp32,mb=4,stage=0", 1)
    assert _bar_tops(memory_figure([bar], None)) == pytest.approx([191.0])  # MiB axis


def test_with_a_tune_record_the_baseline_bar_is_tunes_baseline_plan() -> None:
    tune = _tune_with_baseline()
    data = collect(ReportInputs(profile=make_profile(), tune=tune))  # type: ignore[arg-type]
    by_label = {bar.label: bar for bar in data.memory_bars}
    assert set(by_label) == {"profiled", "tune baseline", "recommended"}
    base = by_label["tune baseline"]
    assert base.plan == Plan(micro_batch=4, nproc_per_node=2).describe()  # not the profile's
    assert base.ranks == 2 and base.caption.endswith(", 2 ranks")
    # pruned, never ran: the bar ends at the peak tune predicted for it
    assert base.height == base.predicted_peak == 300 * MiB and base.measured_peak is None
    assert "trial #8 pruned" in base.source
    rec = tune.recommendation  # type: ignore[attr-defined]
    recommended = by_label["recommended"]
    assert recommended.height == rec.best.peak_memory_bytes  # measured: it ends at that peak
    tops = _bar_tops(memory_figure(data.memory_bars, data.budget_bytes))
    assert tops == pytest.approx([bar.height / MiB for bar in data.memory_bars])  # type: ignore[operator]


def test_the_trials_figure_draws_its_pareto_front_and_the_usable_budget() -> None:
    tune = make_tune()  # 512 MiB budget; trials 0, 2 and 3 form the Pareto front
    data = collect(ReportInputs(tune=tune))
    assert data.trial_margin == pytest.approx(0.1)
    fig = trials_figure(data.trials, data.trial_budget_bytes, data.trial_margin)
    lines = {line.get_gid(): line for line in fig.axes[0].lines}
    front = lines["pareto-front"]
    trials = {t.number: t for t in make_trials()}
    # the axis is in GiB: the pruned trial sits at 1400 MiB
    assert list(np.asarray(front.get_xdata(), dtype=float)) == pytest.approx(
        [trials[n].peak_memory_bytes / GiB for n in (0, 2, 3)]  # type: ignore[operator]
    )
    assert list(np.asarray(front.get_ydata(), dtype=float)) == pytest.approx([9.87, 17.43, 21.09])
    assert front.get_label() == "Pareto front (3 trials)"
    assert np.asarray(lines["budget"].get_xdata(), dtype=float)[0] == pytest.approx(0.5)  # 512 MiB
    usable = np.asarray(lines["usable"].get_xdata(), dtype=float)[0]
    assert usable == pytest.approx(0.45)  # 512 MiB x 0.9
    shown = fig.axes[0].get_legend()
    assert shown is not None
    legend = [text.get_text() for text in shown.get_texts()]
    assert any(text.startswith("Pareto front") for text in legend)
    assert any(text.startswith("usable 0.45 GiB = budget x (1 - 0.1)") for text in legend)
