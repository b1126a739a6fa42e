"""The final comparison reuses the search's runs: only plans whose intervals overlap the best's
are re-run, and the rounds stop once the ranges separate (or at the cap). Trial results are
scripted, so which plans re-run, and how often, follows from the numbers in each case."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autotune.records import Plan
from autotune.search import TrialResult, TrialSettings
from autotune.search._compare import compare, recommendation
from autotune.search._records import RUN_SPREAD, RunReport, TrialRecord
from autotune.search._runner import FakeRunner, TrialRunner

SETTINGS = TrialSettings(model_file="m.py", timeout_s=5)


def _trial(number: int, micro_batch: int, speed: float, spread: float = 0.02,
           blocks: int = 0, role: str = "search") -> TrialRecord:  # fmt: skip
    """A measured trial at ``speed`` samples/s, its median step time known to +-``spread`` (its
    samples/s interval: at least +-:data:`RUN_SPREAD`, the spread between runs)."""
    step = 8 / speed
    plan = Plan(micro_batch=micro_batch, grad_accum=8 // micro_batch, checkpoint_blocks=blocks)
    return TrialRecord(number=number, plan=plan, role=role, state="complete", outcome="ok",  # type: ignore[arg-type]
                       samples_per_s=speed, step_time=step,
                       step_interval=((1 - spread) * step, (1 + spread) * step))  # fmt: skip


def _scripted(speeds: dict[int, list[float]]) -> FakeRunner:
    """Re-runs of micro-batch ``m`` measure ``speeds[m]`` in turn."""
    left: dict[int, Iterator[float]] = {m: iter(v) for m, v in speeds.items()}

    def run(plan: Plan, settings: TrialSettings) -> TrialResult:
        return TrialResult(completed_steps=2, samples_per_s=next(left[plan.micro_batch]),
                           peak_memory_bytes=[1])  # fmt: skip

    return FakeRunner(run)


class _Clocked(TrialRunner):
    """Re-runs of micro-batch ``m`` measure ``speeds[m]``, each taking ``seconds``."""

    def __init__(self, speeds: dict[int, float], seconds: float) -> None:
        self.speeds, self.seconds, self.runs = speeds, seconds, 0

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        self.runs += 1
        result = TrialResult(completed_steps=2, samples_per_s=self.speeds[plan.micro_batch],
                             peak_memory_bytes=[1])  # fmt: skip
        return RunReport(returncode=0, timed_out=False, result=result, duration_s=self.seconds)


def test_a_best_whose_interval_overlaps_none_is_not_re_run() -> None:
    best, base, slow = _trial(0, 4, 20.0), _trial(1, 8, 10.0, role="baseline"), _trial(2, 2, 15.0)
    runner = _scripted({})
    result = compare(runner, SETTINGS, [best, slow, base], base, repeats=3)
    assert runner.plans == []
    assert result.repeats == 0 and result.reruns == [0, 0]
    assert result.labels == ["search best", "baseline"]  # the slow plan is not listed
    # The speedup is the search's: 20/10, its interval from the two single runs' intervals,
    # each +-RUN_SPREAD, not their +-2 % step-time intervals.
    assert result.speedup == pytest.approx(2.0)
    floor = (1 - RUN_SPREAD) / (1 + RUN_SPREAD)
    assert result.speedup_interval == pytest.approx((2.0 * floor, 2.0 / floor))
    assert result.stopped == "no other plan's interval overlaps the best's"


def test_only_overlapping_plans_re_run_until_they_separate() -> None:
    # mb=2 (19.8) overlaps the best (20.0); the baseline (10) and mb=1 (12) do not.
    best, close = _trial(0, 4, 20.0), _trial(1, 2, 19.8)
    base, far = _trial(2, 8, 10.0, role="baseline"), _trial(3, 1, 12.0)
    runner = _scripted({4: [21.0, 21.0], 2: [17.0, 17.0]})
    result = compare(runner, SETTINGS, [best, close, far, base], base, repeats=5)
    # One round: best [20, 21] and mb=2 [17, 19.8] separate; mb=1 and the baseline never re-run.
    assert sorted(p.micro_batch for p in runner.plans) == [2, 4]
    assert result.labels == ["search best", "baseline", "runner-up"]
    assert result.repeats == 1 and result.reruns == [1, 0, 1]
    assert result.winner == 0 and result.measured[0].samples_per_s == pytest.approx(20.5)
    assert result.measured[0].repeats == 2 and result.measured[1].repeats == 1
    assert result.stopped == "the intervals separated after 1 round(s)"


def test_a_plan_the_leaders_re_run_separated_from_is_not_re_run() -> None:
    """The best's search run is wide (20.0 +-8 %: samples/s [18.5, 21.7]), so a runner-up at
    19.9 [18.8, 21.0] and a contender at 18.8 [17.8, 19.8] (single runs, +-5.5 %) both overlap
    it. The best runs first in the round: 21.0, its range now [20.0, 21.0]. The runner-up
    still touches it and runs (19.0: [19.0, 19.9], apart); the contender lies below it and is
    not run at all (the tune at 124M re-ran three plans for 89 s, the third 8 % below the
    best)."""
    best, close = _trial(0, 4, 20.0, spread=0.08), _trial(1, 2, 19.9, spread=0.01)
    slower = _trial(2, 1, 18.8, spread=0.01)
    runner = _scripted({4: [21.0], 2: [19.0]})
    result = compare(runner, SETTINGS, [best, close, slower], None, repeats=3)
    assert [p.micro_batch for p in runner.plans] == [4, 2]
    assert result.labels == ["search best", "runner-up", "contender"]
    assert result.repeats == 1 and result.reruns == [1, 1, 0]
    assert result.stopped == "the intervals separated after 1 round(s)"
    assert result.winner == 0


def test_overlapping_ranges_re_run_up_to_the_cap() -> None:
    # mb=2's search run (19.0 +-5.5 %) overlaps the best's (20.0 +-5.5 %); their medians stay
    # 3-5 % apart and their ranges overlap in every round.
    best, close = _trial(0, 4, 20.0), _trial(1, 2, 19.0, spread=0.05)
    runner = _scripted({4: [21.0, 19.5, 21.0], 2: [20.5, 18.0, 20.6]})
    result = compare(runner, SETTINGS, [best, close], None, repeats=3)
    assert len(runner.plans) == 6 and result.repeats == 3 and result.reruns == [3, 3]
    assert result.stopped is not None and "cap of 3" in result.stopped
    # The winner is the highest median over the search run and the re-runs: 20.5 vs 19.75.
    assert result.winner == 0 and result.measured[1].samples_per_s == pytest.approx(19.75)


def test_medians_within_two_percent_are_not_told_apart_further() -> None:
    # Round 1: best [20.0, 19.0], mb=2 [19.9, 20.2]: 2.8 % apart, overlapping: another round.
    # Round 2: best median 20.0, mb=2 median 19.9: 0.5 % apart, so the third round is not run.
    best, close = _trial(0, 4, 20.0), _trial(1, 2, 19.9)
    runner = _scripted({4: [19.0, 20.5, 19.5], 2: [20.2, 19.2, 20.1]})
    result = compare(runner, SETTINGS, [best, close], None, repeats=3)
    assert len(runner.plans) == 4 and result.repeats == 2 and result.reruns == [2, 2]
    assert result.stopped is not None and "within 2%" in result.stopped
    assert result.winner == 0


def test_tunes_own_work_takes_at_most_30_percent_of_the_search_trials_time() -> None:
    """Eight measured trials of 40 s each: 96 s (30 % of 320 s) for all of tune's own work.
    A round of the best and mb=2 costs 80 s (their search runs' durations): with nothing
    spent before, one round runs and a second would pass 96 s. With 20 s of profiles and
    start-up spent before the search, not even the first does (20 + 80 > 96)."""
    records = [_trial(0, 4, 20.0), _trial(1, 2, 19.0, spread=0.05)] + [
        _trial(n, 1, 12.0 - n / 10) for n in range(2, 8)
    ]
    records = [r.model_copy(update={"duration_s": 40.0}) for r in records]

    runner = _Clocked({4: 21.0, 2: 20.5}, seconds=40.0)
    result = compare(runner, SETTINGS, records, None, repeats=3)
    assert result.repeats == 1 and result.reruns == [1, 1] and runner.runs == 2
    assert result.stopped is not None and "30% of the search's 320 s" in result.stopped
    assert "(0 s before the re-runs, 80 s of re-runs)" in result.stopped

    runner = _Clocked({4: 21.0, 2: 20.5}, seconds=40.0)
    result = compare(runner, SETTINGS, records, None, repeats=3, overhead_s=20.0)
    assert result.repeats == 0 and result.reruns == [0, 0] and runner.runs == 0
    assert result.stopped is not None
    assert "(20 s before the re-runs, 0 s of re-runs)" in result.stopped


def test_repeats_0_re_runs_nothing_even_when_intervals_overlap() -> None:
    best, close = _trial(0, 4, 20.0), _trial(1, 2, 19.9)
    runner = _scripted({})
    result = compare(runner, SETTINGS, [best, close], None, repeats=0)
    assert runner.plans == [] and result.reruns == [0, 0] and result.cap == 0


def test_a_checkpointed_winner_gives_way_to_its_overlapping_plain_twin() -> None:
    # The checkpointed plan measured a hair faster, within the plain twin's range.
    ckpt = _trial(0, 4, 20.0, blocks=6)
    plain = _trial(1, 4, 19.9)
    runner = _scripted({4: [19.9, 20.0, 19.9, 20.0, 19.9, 20.0]})
    result = compare(runner, SETTINGS, [ckpt, plain], None, repeats=3)
    assert result.measured[result.winner].plan.checkpoint_blocks == 0
    notes: list[str] = []
    rec = recommendation([ckpt, plain], result, "m.py", None, notes)
    assert rec is not None and rec.plan == plain.plan
    assert any("checkpointing did not show to pay" in n for n in notes)


def test_a_higher_zero_stage_gives_way_to_its_overlapping_lower_stage_twin() -> None:
    # ZeRO-1 measured 1 % faster than ZeRO-0 in the search, each a single run: nothing re-run
    # (repeats 0), and ZeRO-0 recommended, since stage 1 did not show to buy time
    def staged(number: int, speed: float, stage: int) -> TrialRecord:
        trial = _trial(number, 2, speed)
        return trial.model_copy(update={"plan": trial.plan.with_changes(zero_stage=stage)})

    one, zero = staged(0, 20.0, 1), staged(1, 19.8, 0)
    result = compare(_scripted({}), SETTINGS, [one, zero], None, repeats=0)
    assert result.measured[result.winner].plan == zero.plan
    notes: list[str] = []
    rec = recommendation([one, zero], result, "m.py", None, notes)
    assert rec is not None and rec.plan == zero.plan
    assert any("so ZeRO stage 1 did not show to pay" in n for n in notes)


def test_a_single_runs_lead_within_the_spread_between_runs_does_not_keep_its_stage() -> None:
    """Issue 33's tiny-Llama tune: ZeRO-1's single run measured 171.3 samples/s and ZeRO-0's
    162.3 (5.5 % apart), here each given a step-time interval of +-1 %; re-run five times
    later, the two ran 157 and 167. No re-run fits tune's budget (6.8 s of profiles and start-up, 30 % of
    36 s of trials, an 8 s round), so the two single runs decide: 5.5 % apart is within two runs'
    spread, so ZeRO-0 is recommended. The same ZeRO-0 run 15 % behind is told apart."""

    def staged(number: int, speed: float, stage: int) -> TrialRecord:
        trial = _trial(number, 2, speed, spread=0.01)
        return trial.model_copy(update={"plan": trial.plan.with_changes(zero_stage=stage),
                                        "duration_s": 4.0})  # fmt: skip

    others = [_trial(n, 1, 100.0 - n).model_copy(update={"duration_s": 4.0}) for n in range(2, 9)]
    one, zero = staged(0, 171.3, 1), staged(1, 162.3, 0)
    runner = _Clocked({2: 160.0}, seconds=4.0)
    result = compare(runner, SETTINGS, [one, zero, *others], None, repeats=3, overhead_s=6.8)
    assert runner.runs == 0 and result.reruns == [0, 0]
    assert result.measured[result.winner].plan == zero.plan
    notes: list[str] = []
    rec = recommendation([one, zero, *others], result, "m.py", None, notes)
    assert rec is not None and rec.plan == zero.plan
    assert any("so ZeRO stage 1 did not show to pay" in n for n in notes)

    behind = staged(1, 171.3 * 0.85, 0)
    result = compare(runner, SETTINGS, [one, behind, *others], None, repeats=3, overhead_s=6.8)
    assert result.measured[result.winner].plan == one.plan and runner.runs == 0


def test_a_checkpointed_winner_that_separated_from_its_twin_stays() -> None:
    ckpt, plain = _trial(0, 4, 20.0, blocks=6), _trial(1, 4, 15.0)
    result = compare(_scripted({}), SETTINGS, [ckpt, plain], None, repeats=3)
    assert result.measured[result.winner].plan.checkpoint_blocks == 6


def test_a_plan_whose_re_run_fails_is_not_recommended_on_its_search_run() -> None:
    best, close = _trial(0, 4, 20.0), _trial(1, 2, 19.9)

    def run(plan: Plan, settings: TrialSettings) -> TrialResult | str:
        if plan.micro_batch == 4:
            return "crash"
        return TrialResult(completed_steps=2, samples_per_s=19.9, peak_memory_bytes=[1])

    runner = FakeRunner(run)
    result = compare(runner, SETTINGS, [best, close], None, repeats=3)
    # The failed plan drops out after the first round; the other is left alone and wins.
    assert len(runner.plans) == 2 and result.reruns == [0, 1]
    assert result.winner == 1


def _with_sdpa(record: TrialRecord) -> TrialRecord:
    return record.model_copy(update={"plan": record.plan.with_changes(attention="sdpa")})


def _by_attention(speeds: dict[str, list[float]]) -> FakeRunner:
    """Runs of a plan with attention ``a`` measure ``speeds[a]`` in turn."""
    left = {attention: iter(values) for attention, values in speeds.items()}

    def run(plan: Plan, settings: TrialSettings) -> TrialResult:
        return TrialResult(completed_steps=2, samples_per_s=next(left[plan.attention]),
                           peak_memory_bytes=[1])  # fmt: skip

    return FakeRunner(run)


@pytest.mark.parametrize(("unchanged", "wins", "why"), [
    ([23.0, 23.0, 23.0], True, "measured faster"),  # SDPA slower, as on a CPU at 124M
    ([19.9, 20.0, 19.9, 20.0], True, "their ranges overlap"),  # equal: the leaner plan
    ([15.0, 15.0, 15.0], False, None),  # SDPA pays: it stays
])  # fmt: skip
def test_the_policys_attention_is_measured_against_the_model_unchanged(
    unchanged: list[float], wins: bool, why: str | None
) -> None:
    """The search ran every plan with the policy's attention=sdpa; its best is run once more
    without it, and that twin wins when faster or when the two cannot be told apart."""
    best, other = _with_sdpa(_trial(0, 4, 20.0)), _with_sdpa(_trial(1, 2, 12.0))
    runner = _by_attention({"sdpa": [20.0, 20.0, 20.0], "default": unchanged})
    result = compare(runner, SETTINGS, [best, other], None, repeats=3)
    assert runner.plans[0] == best.plan.with_changes(attention="default")  # run first, once
    assert result.labels == ["search best", "search best, model code unchanged"]
    won = result.measured[result.winner].plan
    assert won.attention == ("default" if wins else "sdpa")
    notes: list[str] = []
    rec = recommendation([best, other], result, "m.py", None, notes)
    assert rec is not None and rec.plan == won
    said = [n for n in notes if "the policy's code change did not show to pay" in n]
    assert (len(said) == 1 and why in said[0]) if wins else not said


def test_re_runs_measure_no_peak_the_first_runs_did_and_no_run_sweeps_the_link() -> None:
    """The twin's first run is the plan's first: it measures the peak. The rounds' re-runs of
    plans already run skip the untimed peak step, and what each re-run reports as a peak is
    not taken: the plan's peak is its first run's. No comparison run sweeps the link (the
    search's stands)."""
    best = _with_sdpa(_trial(0, 4, 20.0)).model_copy(update={"peak_memory_bytes": 700})
    asked: list[tuple[str, bool]] = []
    sweeps: list[bool] = []
    speeds = {"sdpa": iter([20.1, 20.2]), "default": iter([20.0, 19.9, 20.05])}
    peaks = {"sdpa": 999, "default": 500}

    def run(plan: Plan, settings: TrialSettings) -> TrialResult:
        asked.append((plan.attention, settings.measure_peak))
        sweeps.append(settings.sweep_link)
        return TrialResult(completed_steps=2, samples_per_s=next(speeds[plan.attention]),
                           peak_memory_bytes=[peaks[plan.attention]])  # fmt: skip

    result = compare(FakeRunner(run), SETTINGS, [best], None, repeats=2)
    assert result.repeats >= 1, result.stopped
    assert asked[0] == ("default", True)  # the twin, never run before
    assert asked[1:] and all(not measure for _, measure in asked[1:])
    assert [m.peak_memory_bytes for m in result.measured] == [700, 500]
    assert sweeps and not any(sweeps)


def test_no_twin_runs_for_a_best_that_changes_no_code_or_at_repeats_0() -> None:
    best, other = _trial(0, 4, 20.0), _trial(1, 2, 12.0)
    runner = _scripted({})
    assert compare(runner, SETTINGS, [best, other], None, repeats=3).labels == ["search best"]
    sdpa = _with_sdpa(best)
    assert compare(runner, SETTINGS, [sdpa, other], None, repeats=0).labels == ["search best"]
    assert runner.plans == []


def test_the_twins_run_counts_in_the_comparisons_share_of_the_search_time() -> None:
    """200 s of search trials allow 60 s of tune's own work. The unchanged-code twin's run takes
    30 s of them; a round of the best (10 s) and the twin (30 s) would make 70 s: it does not
    start, though the round alone (40 s) would have fit."""
    best = _with_sdpa(_trial(0, 4, 20.0)).model_copy(update={"duration_s": 10.0})
    other = _trial(1, 2, 12.0).model_copy(update={"duration_s": 190.0})
    runner = _Clocked({4: 20.0, 2: 12.0}, seconds=30.0)
    result = compare(runner, SETTINGS, [best, other], None, repeats=3)
    assert runner.runs == 1 and result.repeats == 0  # the twin's run only
    assert result.stopped.startswith("another round (40 s) would take tune's own work past")
