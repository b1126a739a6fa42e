"""The final comparison (the search's runs reused; only the plans whose intervals overlap the
best's re-run, interleaved, until the intervals separate); the recommendation."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotune.records import MeasuredPlan, Plan, Recommendation, TrialResult, TrialSettings
from autotune.search._outcome import classify_outcome
from autotune.search._records import RUN_SPREAD, Comparison, TrialRecord
from autotune.search._runner import TrialRunner

BASELINE = "baseline"
BEST = "search best"
BOTH = "search best = baseline"
RUNNER_UP = "runner-up"
CONTENDER = "contender"
UNCHANGED = "search best, model code unchanged"
"""The search's best without the policy's code changes (attention, compile), which hold for
every trial of the search: run once here so that they are measured, not assumed, to pay."""
CONTENDERS = 2
"""Plans besides the best and the baseline the comparison may list (the fastest overlapping)."""
EQUIVALENT = 0.02
"""Re-run plans whose medians lie this close (relative) to the leader's are not told apart
further: either is within it of the other, and more rounds would only buy the last percent."""
OVERHEAD_SHARE = 0.3
"""tune's own work beyond its search (the profiles, the workers' start-up, the re-runs) takes at
most this share of the search's trial time (issue 33: tune within 1.3x its trials): a round of
re-runs starts only where its plans' last run times fit in what the rest left."""
Value = tuple[float, float | None, int | None]
"""One run's samples/s, tokens/s and peak."""
Round = list[Value | None]
Interval = tuple[float, float]


def search_interval(record: TrialRecord) -> Interval | None:
    """A trial's samples/s interval, from its median step time's, at least :data:`RUN_SPREAD`
    either side of its samples/s (``None``: not measured)."""
    if record.samples_per_s is None or record.step_interval is None or not record.step_time:
        return None
    low, high = record.step_interval
    if low <= 0 or high < low:
        return None
    work = record.samples_per_s * record.step_time  # samples per step
    speed = record.samples_per_s
    return min(work / high, speed * (1 - RUN_SPREAD)), max(work / low, speed * (1 + RUN_SPREAD))


def overlap(a: Interval | None, b: Interval | None) -> bool:
    """Whether two intervals overlap; one not measured cannot be told apart, so it does."""
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def entries(
    ranked: list[TrialRecord], baseline: TrialRecord | None
) -> list[tuple[str, TrialRecord]]:
    """What the final comparison lists, labelled: the search's best, the baseline (for the
    speedup) and up to :data:`CONTENDERS` plans whose intervals overlap the best's."""
    best = ranked[0]
    if baseline is not None and baseline.plan == best.plan:
        chosen = [(BOTH, best)]
    else:
        chosen = [(BEST, best)] + ([(BASELINE, baseline)] if baseline is not None else [])
    others = [
        r
        for r in ranked[1:]
        if (baseline is None or r.plan != baseline.plan)
        and overlap(search_interval(r), search_interval(best))
    ]
    for index, record in enumerate(others[:CONTENDERS]):
        chosen.append((RUNNER_UP if index == 0 else CONTENDER, record))
    return chosen


def unchanged_model(plan: Plan) -> Plan | None:
    """``plan`` with the model's code left as the user wrote it (default attention, no
    ``torch.compile``); ``None`` where ``plan`` changes neither."""
    if not _code_changes(plan):
        return None
    return plan.with_changes(attention="default", compile=False)


def code_pair(records: list[TrialRecord]) -> tuple[TrialRecord, TrialRecord] | None:
    """The policy's plan and its twin with the model's code unchanged (queued for it, or the
    baseline where that is the twin), both measured (``None``: either not yet, or not ok)."""
    measured = [r for r in records if r.outcome == "ok" and r.samples_per_s]
    changed = next((r for r in measured if r.role == "policy"), None)
    twin = unchanged_model(changed.plan) if changed is not None else None
    same = [r for r in measured if r.plan == twin and r.role in ("unchanged", "baseline")]
    return (changed, same[0]) if changed is not None and same else None


def _code_changes(plan: Plan) -> int:
    """How many of the model's code knobs ``plan`` turns (attention kernel, compile)."""
    return (plan.attention != "default") + plan.compile


def _unchanged_entry(runner: TrialRunner, settings: TrialSettings, ranked: list[TrialRecord],
                     chosen: list[tuple[str, TrialRecord]]) -> tuple[str, TrialRecord] | None:  # fmt: skip
    """The search's best without its code changes, as the search measured it or run once now
    (``None``: the best changes no code, the twin is listed already, or its run failed). The
    search that measured the code changes on the policy's plan and kept them (they paid there:
    :func:`code_pair`) runs no twin here."""
    twin = unchanged_model(ranked[0].plan)
    if twin is None or any(record.plan == twin for _, record in chosen):
        return None
    measured = next((record for record in ranked if record.plan == twin), None)
    if measured is not None:
        return UNCHANGED, measured
    if code_pair(ranked) is not None:
        return None
    result, seconds = _measured_run(runner, settings, twin)
    if result is None:
        return None
    return UNCHANGED, TrialRecord(
        number=-1, plan=twin, state="complete", outcome="ok", samples_per_s=result.samples_per_s,
        tokens_per_s=result.tokens_per_s, step_time=result.step_time,
        step_interval=result.step_interval, peak_memory_bytes=result.peak,
        peak_source=result.peak_source, duration_s=seconds,
    )  # fmt: skip


def _measured_run(runner: TrialRunner, settings: TrialSettings,
                  plan: Plan) -> tuple[TrialResult | None, float]:  # fmt: skip
    """One run's result where it measured samples/s (``None``: it failed), and its seconds."""
    report = runner.run(plan, settings)
    result = report.result
    outcome = classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail)
    if outcome == "ok" and result is not None and result.samples_per_s is not None:
        return result, report.duration_s
    return None, report.duration_s


def _run(runner: TrialRunner, settings: TrialSettings, plan: Plan) -> tuple[Value | None, float]:
    """One re-run's samples/s and tokens/s (``None``: it failed), and its seconds. A re-run
    measures no peak: the plan's first run did (one untimed step fewer)."""
    result, seconds = _measured_run(
        runner, settings.model_copy(update={"measure_peak": False}), plan
    )
    if result is None or result.samples_per_s is None:
        return None, seconds
    return (result.samples_per_s, result.tokens_per_s, None), seconds


def _range(values: list[Value], record: TrialRecord) -> Interval | None:
    """The samples/s range of a plan's runs; a single run: its search interval."""
    if len(values) == 1:
        return search_interval(record)
    samples = [v[0] for v in values]
    return min(samples), max(samples)


def _median(values: list[Value]) -> float:
    return statistics.median(v[0] for v in values)


def _still_open(active: list[int], values: list[list[Value]],
                chosen: list[tuple[str, TrialRecord]]) -> tuple[list[int], list[int]]:  # fmt: skip
    """The entries whose range still overlaps the leader's (the leader included), and those
    of them re-run whose median is within :data:`EQUIVALENT` of the leader's (left out)."""
    leader, top = _leader(active, values, chosen)
    lead = _median(values[leader])
    still = [i for i in active if overlap(_range(values[i], chosen[i][1]), top)]
    equal = [
        i
        for i in still
        if i != leader
        and min(len(values[i]), len(values[leader])) > 1
        and lead - _median(values[i]) <= EQUIVALENT * lead
    ]
    return [i for i in still if i not in equal], equal


def _leader(active: list[int], values: list[list[Value]],
            chosen: list[tuple[str, TrialRecord]]) -> tuple[int, Interval | None]:  # fmt: skip
    """The entry with the highest median so far, and its range."""
    leader = max(active, key=lambda i: _median(values[i]))
    return leader, _range(values[leader], chosen[leader][1])


def _below_leader(position: int, active: list[int], values: list[list[Value]],
                  chosen: list[tuple[str, TrialRecord]]) -> bool:  # fmt: skip
    """Whether ``position``'s range lies apart from (below) the leader's as measured so far:
    another run of it cannot make it the pick, so a round does not pay for one."""
    leader, top = _leader(active, values, chosen)
    return position != leader and not overlap(_range(values[position], chosen[position][1]), top)


def _rerun(runner: TrialRunner, settings: TrialSettings, chosen: list[tuple[str, TrialRecord]],
           values: list[list[Value]], cap: int, failed: set[int],
           searched: float, spent: float = 0.0) -> tuple[list[Round], str]:  # fmt: skip
    """Rounds of interleaved re-runs of the entries overlapping the best, an entry skipped in
    a round once the leader's range (narrowed by its run earlier in that round) has separated
    from its own; each round dropping those whose range has separated below the leader's or
    whose median has come within :data:`EQUIVALENT` of it (and those whose re-run failed, into
    ``failed``); at most ``cap`` rounds, and none past :data:`OVERHEAD_SHARE` of the search's ``searched`` seconds of
    trials (0: not known, no such limit), ``spent`` of them already taken (the profiles and
    start-up, the unchanged-code twin's run)."""
    best = search_interval(chosen[0][1])
    active = [i for i, (_, r) in enumerate(chosen) if overlap(search_interval(r), best)]
    if len(active) < 2:
        return [], "no other plan's interval overlaps the best's"
    if cap < 1:
        return [], "repeats=0: nothing re-run"
    seconds = [record.duration_s for _, record in chosen]
    budget = OVERHEAD_SHARE * searched if searched else None
    before = spent
    rounds: list[Round] = []
    while len(rounds) < cap:
        cost = sum(seconds[i] or 0.0 for i in active)
        if budget is not None and spent + cost > budget:
            return rounds, (f"another round ({cost:.0f} s) would take tune's own work past "
                            f"{OVERHEAD_SHARE:.0%} of the search's {searched:.0f} s of trials "
                            f"({before:.0f} s before the re-runs, {spent - before:.0f} s of "
                            f"re-runs), after {len(rounds)} round(s)")  # fmt: skip
        row: Round = [None] * len(chosen)
        shift = len(rounds) % len(active)
        for position in active[shift:] + active[:shift]:
            if _below_leader(position, active, values, chosen):
                continue  # the leader's run this round narrowed its range past this one's
            row[position], seconds[position] = _run(runner, settings, chosen[position][1].plan)
            spent += seconds[position] or 0.0
            if row[position] is not None:
                values[position].append(row[position])  # type: ignore[arg-type]
            else:
                failed.add(position)
        rounds.append(row)
        active, equal = _still_open(
            [i for i in active if row[i] is not None] or [0], values, chosen
        )
        if len(active) < 2:
            if equal:
                return rounds, (f"the medians came within {EQUIVALENT:.0%} of the leader's after "
                                f"{len(rounds)} round(s): not told apart further")  # fmt: skip
            return rounds, f"the intervals separated after {len(rounds)} round(s)"
    return rounds, f"the cap of {cap} round(s) was reached with the intervals still overlapping"


def _measured(record: TrialRecord, values: list[Value]) -> MeasuredPlan:
    tokens = [v[1] for v in values if v[1] is not None]
    peaks = [v[2] for v in values if v[2] is not None]
    return MeasuredPlan(
        plan=record.plan,
        samples_per_s=_median(values),
        samples_per_s_interval=_range(values, record),
        tokens_per_s=statistics.median(tokens) if tokens else None,
        peak_memory_bytes=max(peaks) if peaks else None,
        repeats=len(values),
    )


def _from_search(record: TrialRecord) -> Value:
    return record.samples_per_s or 0.0, record.tokens_per_s, record.peak_memory_bytes


def baseline_index(labels: list[str]) -> int | None:
    """Where the baseline is among the compared entries (``None``: it did not run)."""
    return next((i for i, label in enumerate(labels) if label in (BASELINE, BOTH)), None)


def compare(runner: TrialRunner, settings: TrialSettings, ranked: list[TrialRecord],
            baseline: TrialRecord | None, repeats: int, overhead_s: float = 0.0) -> Comparison:  # fmt: skip
    """The search's best against the baseline and the plans it cannot be told apart from.

    Every entry starts from its search run. Those whose intervals overlap the best's are
    re-run in interleaved rounds (the order rotating) until the ranges separate, the
    medians come within :data:`EQUIVALENT` of each other, ``repeats`` rounds have run, or
    another round would take tune's own work (``overhead_s`` of profiles and start-up before
    the search, the re-runs after it) past :data:`OVERHEAD_SHARE` of the search's trial time.
    Where the best changes the model's code (the policy's attention or compile) its twin
    without them is listed too, run once where the search did not. The winner is the highest median (the
    search's run included); a winner gives way to its leaner twin (fewer blocks checkpointed,
    fewer code changes, or a lower ZeRO stage) when their ranges overlap, since what it adds did
    not show to pay.
    The speedup interval is the range of per-round ratios winner/baseline where both were
    re-run (slow phases of the machine hit both); otherwise the ratio of medians, its interval
    from their ranges.
    """
    chosen = entries(ranked, baseline)
    settings = settings.model_copy(update={"sweep_link": False})  # the search's link stands
    twin = _unchanged_entry(runner, settings, ranked, chosen) if repeats > 0 else None
    chosen += [twin] if twin is not None else []
    labels = [label for label, _ in chosen]
    base = baseline_index(labels)
    values = [[_from_search(record)] for _, record in chosen]
    failed: set[int] = set()
    searched = sum(record.duration_s or 0.0 for record in ranked)
    ran = (twin[1].duration_s or 0.0) if twin is not None and twin[1].number < 0 else 0.0
    rounds, stopped = _rerun(runner, settings, chosen, values, repeats, failed, searched,
                             overhead_s + ran)  # fmt: skip
    measured = [_measured(record, values[i]) for i, (_, record) in enumerate(chosen)]
    # A plan whose re-run failed is not recommended on its other runs.
    eligible = [i for i in range(len(chosen)) if i not in failed] or [0]
    winner = _leaner_equal(measured, max(eligible, key=lambda i: measured[i].samples_per_s))
    speedup, interval = _speedup(rounds, measured, winner, base)
    return Comparison(repeats=len(rounds), measured=measured, labels=labels, winner=winner,
                      speedup=speedup, speedup_interval=interval,
                      reruns=[len(v) - 1 for v in values], cap=repeats, stopped=stopped)  # fmt: skip


def _leaner(plan: Plan, than: Plan) -> bool:
    """Whether ``plan`` is ``than`` less some of its checkpointed blocks, code changes
    (attention, compile) and/or ZeRO stage (the same engine sharding less, so communicating
    less), and otherwise the same."""
    fewer = (plan.checkpoint_blocks <= than.checkpoint_blocks and plan.compile <= than.compile
             and plan.zero_stage <= than.zero_stage)  # fmt: skip
    same = {"checkpoint_blocks": than.checkpoint_blocks, "attention": than.attention,
            "compile": than.compile, "zero_stage": than.zero_stage}  # fmt: skip
    return (plan != than and fewer and plan.attention in ("default", than.attention)
            and plan.with_changes(**same) == than)  # fmt: skip


def _unpaid(plan: Plan, than: Plan) -> str:
    """What ``than`` turns that its leaner twin ``plan`` does not (:func:`_leaner`)."""
    knobs = [("the checkpointing", plan.checkpoint_blocks < than.checkpoint_blocks),
             (f"ZeRO stage {than.zero_stage}", plan.zero_stage < than.zero_stage),
             ("the code change", _code_changes(plan) < _code_changes(than))]  # fmt: skip
    return " and ".join(name for name, turned in knobs if turned)


def _leaner_equal(measured: list[MeasuredPlan], winner: int) -> int:
    """The leanest entry (fewest checkpointed blocks, then fewest code changes, then the lowest
    ZeRO stage) that is the winner's plan otherwise and whose range overlaps the winner's; the
    winner itself when there is none. Both ran within the budget, so what the winner adds buys
    no memory that is needed, and the measurements did not show it to buy time."""
    won = measured[winner]
    twins = [
        i
        for i, m in enumerate(measured)
        if _leaner(m.plan, won.plan)
        and overlap(m.samples_per_s_interval, won.samples_per_s_interval)
        and (m.samples_per_s_interval or won.samples_per_s_interval) is not None
    ]
    return min(twins, default=winner,
               key=lambda i: (measured[i].plan.checkpoint_blocks, _code_changes(measured[i].plan),
                              measured[i].plan.zero_stage))  # fmt: skip


def _speedup(rounds: list[Round], measured: list[MeasuredPlan], winner: int,
             base: int | None) -> tuple[float | None, Interval | None]:  # fmt: skip
    if base is None:
        return None, None
    if winner == base:
        return 1.0, (1.0, 1.0)
    ratios = [row[winner][0] / row[base][0] for row in rounds if row[winner] and row[base]]  # type: ignore[index]
    if ratios:
        return statistics.median(ratios), (min(ratios), max(ratios))
    won, was = measured[winner], measured[base]
    ratio = won.samples_per_s / was.samples_per_s if was.samples_per_s else None
    a, b = won.samples_per_s_interval, was.samples_per_s_interval
    if ratio is None or a is None or b is None or b[0] <= 0:
        return ratio, None
    return ratio, (a[0] / b[1], a[1] / b[0])


def recommendation(ranked: list[TrialRecord], comparison: Comparison | None, model_file: str,
                   code_changes: Callable[[Plan], list[Any]] | None,
                   notes: list[str]) -> Recommendation | None:  # fmt: skip
    """The tune recommendation: the comparison's winner next to the baseline."""
    if not ranked:
        notes.append("no plan ran to completion: nothing to recommend")
        return None
    if comparison is None:  # left to another worker; a note says which
        return None
    labels = comparison.labels
    best = comparison.measured[comparison.winner]
    base = baseline_index(labels)
    notes.append(_comparison_note(comparison))
    if labels[comparison.winner] == UNCHANGED:
        changed = _best_median(comparison)
        won = "measured faster" if best.samples_per_s > changed else "their ranges overlap"
        notes.append(f"{best.plan.describe()} is recommended over {ranked[0].plan.describe()}: "
                     f"{won} ({best.samples_per_s:.3g} against {changed:.3g} samples/s, "
                     "medians), so the policy's code change did not show to pay")  # fmt: skip
    elif _leaner(best.plan, ranked[0].plan):
        notes.append(f"{best.plan.describe()} is recommended over {ranked[0].plan.describe()}: "
                     f"their ranges overlap, so {_unpaid(best.plan, ranked[0].plan)} did not show "
                     "to pay")  # fmt: skip
    elif labels[comparison.winner] not in (BEST, BOTH):
        notes.append(f"the {labels[comparison.winner]} measured fastest in the re-runs, "
                     f"not the search's best ({ranked[0].plan.describe()})")  # fmt: skip
    low = comparison.speedup_interval[0] if comparison.speedup_interval else None
    if low is not None and low <= 1.0 and labels[comparison.winner] not in (BASELINE, BOTH):
        notes.append("the speedup interval reaches 1.0: not a clear win over the baseline")
    return Recommendation(
        source="tune", plan=best.plan, model_file=model_file, best=best,
        baseline=comparison.measured[base] if base is not None else None,
        speedup=comparison.speedup, speedup_interval=comparison.speedup_interval,
        code_changes=code_changes(best.plan) if code_changes else [], notes=list(notes),
    )  # fmt: skip


def _best_median(comparison: Comparison) -> float:
    """The search best's median samples/s in the comparison."""
    index = next(i for i, label in enumerate(comparison.labels) if label in (BEST, BOTH))
    return comparison.measured[index].samples_per_s


def _comparison_note(comparison: Comparison) -> str:
    """How the compared figures came about: which plans were re-run, how often, and why not more."""
    if comparison.cap == 0 or (comparison.cap is None and not comparison.repeats):
        return ("repeats=0: nothing re-run; the search's single runs are compared, so the "
                "ranking and the speedup carry the machine's run-to-run noise")  # fmt: skip
    if comparison.reruns is None:  # an older record: every entry re-run ``repeats`` times
        return (f"search best, baseline and runner-up re-run {comparison.repeats}x interleaved: "
                "medians; intervals are min-max over the repeats")  # fmt: skip
    rerun = [label for label, n in zip(comparison.labels, comparison.reruns, strict=True) if n]
    if not rerun:
        return (f"nothing re-run: {comparison.stopped}; the search's runs are compared, "
                f"intervals from their step times, at least {RUN_SPREAD:.1%} either side, the "
                "spread between runs")  # fmt: skip
    return (f"re-run interleaved, up to {comparison.repeats} round(s): {', '.join(rerun)} "
            f"({comparison.stopped}); medians and min-max ranges include the search's run")  # fmt: skip
