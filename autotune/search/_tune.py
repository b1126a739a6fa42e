"""``tune()``: run the study (ask, prune, run, tell), then re-measure the winners interleaved."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autotune.estimator import engine_keys
from autotune.records import (
    LinkMeasure,
    Machine,
    Plan,
    Terminated,
    TrialSettings,
    TuneOptions,
    sigterm_unwinds,
)
from autotune.search import _shared, _study
from autotune.search._compare import (
    code_pair,
    overlap,
    recommendation,
    search_interval,
    unchanged_model,
)
from autotune.search._final import final_comparison
from autotune.search._knobs import leaner_plan, unpaid_knob
from autotune.search._outcome import classify_outcome, outcome_reason
from autotune.search._records import RUN_SPREAD, Role, TrialRecord, TuneRecord, WallTime
from autotune.search._runner import TrialRunner
from autotune.search._space import Predict, Prediction, SearchSpace, make_space, oom_lesson
from autotune.search._steer import predicted_front, slower_than_best, stop_slower_than


@dataclass(frozen=True)
class Progress:
    """What the CLI shows after each trial."""

    measured: int
    target: int
    best: TrialRecord | None
    last: TrialRecord
    seconds_left: float | None


def _fit_micro_batch(space: SearchSpace, plan: Plan) -> Plan:
    """The plan moved onto the space: the largest allowed micro-batch not above its own."""
    allowed = [m for m in space.micro_batches if m <= plan.micro_batch] or [1]
    blocks = min(plan.checkpoint_blocks, space.blocks)
    point = {**space.params(plan), "micro_batch": allowed[-1], "checkpoint_blocks": blocks}
    return space.plan(point).with_changes(
        **{
            k: getattr(plan, k)
            for k in ("attention", "compile", "dataloader_workers", "pin_memory")
        }
    )


def _value(record: TrialRecord) -> float | None:
    return record.tokens_per_s if record.tokens_per_s is not None else record.samples_per_s


def best_records(records: list[TrialRecord]) -> list[TrialRecord]:
    """Measured-ok trials, best first, one per distinct plan."""
    seen: set[str] = set()
    ranked = []
    for record in sorted(
        (r for r in records if r.outcome == "ok" and _value(r) is not None),
        key=lambda r: -(_value(r) or 0.0),
    ):
        key = record.plan.model_dump_json()
        if key not in seen:
            seen.add(key)
            ranked.append(record)
    return ranked


def _why_stopped(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by SIGINT"
    if isinstance(exc, Terminated):
        return str(exc)
    return f"stopped by {type(exc).__name__}: {exc}"


def _engine_costs_said(link: LinkMeasure) -> str:
    """How the link's engine costs were had, for the link's note: measured after the sweep, or
    kept from an earlier sweep on this machine (and where)."""
    total, kept = len(link.engine_costs), len(link.engine_costs_kept)
    if not kept:
        return f" and the engines' own costs, {total} measured after it" if total else ""
    fresh = f", {total - kept} measured after it" if kept < total else ""
    return (f" and the engines' own costs: {kept} kept from an earlier sweep on this machine "
            f"({link.engine_costs_file}; delete it to measure them anew){fresh}")  # fmt: skip


class _Search:
    """One worker's ask-run-tell loop over a shared study."""

    def __init__(self, study: Any, space: SearchSpace, runner: TrialRunner,
                 settings: TrialSettings, predict: Predict | None,
                 relink: Callable[[LinkMeasure], Predict] | None = None,
                 front: int = 0) -> None:  # fmt: skip
        self.study, self.space, self.runner = study, space, runner
        self.settings, self.predict, self.relink = settings, predict, relink
        self.front = front
        """Plans of the predicted front still to queue (:meth:`queue_front`)."""
        self.link: LinkMeasure | None = None
        self.code_decided = False
        self.code_dropped = False
        self._predictions: dict[Plan, Prediction] = {}
        if relink is not None and settings.sweep_link and not settings.engine_costs:
            # the link's sweep also measures the engines of the plans that may run (~1 s each)
            runnable = [plan for plan in space.all_plans()
                        if (found := self.prediction(plan)) is None or found.fits]  # fmt: skip
            self.settings = settings.model_copy(update={"engine_costs": engine_keys(runnable)})

    def learn_link(self, records: list[TrialRecord], notes: list[str]) -> None:
        """Once a multi-rank trial has swept the link between its ranks, predict every plan
        from then on with communication timed on it (``relink``)."""
        if self.link is not None or self.relink is None:
            return
        swept = next((r for r in records if r.link is not None), None)
        if swept is None or swept.link is None:
            return
        self.link = link = swept.link
        self.predict = self.relink(link)
        self._predictions.clear()
        notes.append(
            f"link between the ranks, swept after trial {swept.number}: "
            f"{link.latency_s * 1e6:.0f} us + {link.gbps:.3g} Gbit/s bus ({link.backend}); the "
            f"predictions after it time communication on it{_engine_costs_said(link)}"
        )

    def queue_front(self, records: list[TrialRecord], notes: list[str]) -> None:
        """Queue the predicted front held back until the link was swept: ranked by the estimate
        that times communication on it and knows the engines' own costs (without them, on the
        124M model here, it ranked bf16 mb=1 ga=4 first at every stage, the slowest micro-batch
        of the sharded plans; with them, bf16 mb=4 at ZeRO-1 and FSDP2 stage 2, the grid's third
        and best, came first). Queued at once if the queue drains first (no trial swept a link)."""
        if not self.front or self.predict is None:
            return
        if self.link is None and any(r.state == "waiting" for r in records):
            return
        plans = _enqueue_front(self.study, self.space, self.predict, self.front)
        self.front = 0
        when = "after the link's sweep" if self.link is not None else "without a swept link"
        notes.append(f"predicted front queued {when}: "
                     + ", ".join(plan.describe() for plan in plans))  # fmt: skip

    def learn_code(self, records: list[TrialRecord], notes: list[str]) -> None:
        """Once the policy's plan and its twin with the model's code unchanged have both been
        measured, the search keeps the policy's code changes (fused attention, compile) only
        where they paid there: where the twin ran faster, or the two cannot be told apart, every
        plan from then on runs the code as written (the leaner plan, as the final comparison
        prefers it), the queued ones included."""
        if self.code_decided:
            return
        pair = code_pair(records)
        if pair is None:
            return
        self.code_decided = True
        changed, unchanged = pair
        faster = (unchanged.samples_per_s or 0.0) > (changed.samples_per_s or 0.0)
        tied = overlap(search_interval(changed), search_interval(unchanged))
        verdict = "faster" if faster else "not told apart" if tied else "slower"
        shown = (f"trial {unchanged.number}, the policy's plan with the model's code unchanged, "
                 f"ran {unchanged.samples_per_s:.3g} samples/s against {changed.samples_per_s:.3g} "
                 f"(trial {changed.number}): {verdict}")  # fmt: skip
        if not (faster or tied):
            notes.append(f"{shown}; the policy's code changes are kept for every plan")
            return
        self.code_dropped = True
        self.space = replace(self.space, base=unchanged_model(self.space.base) or self.space.base)
        self._predictions.clear()
        notes.append(f"{shown}; every plan from then on runs the model's code as written")

    def as_space_plan(self, plan: Plan) -> Plan:
        """``plan`` as a point of the space the search now runs: without the policy's code
        changes once they were dropped."""
        return (unchanged_model(plan) or plan) if self.code_dropped else plan

    def _as_decided(self, trial: Any, plan: Plan, role: str) -> Plan:
        """``plan`` without the policy's code changes once the search has dropped them (the
        policy's plan and its twin, queued to decide it, as they are)."""
        mapped = self.as_space_plan(plan)
        if mapped == plan or role in ("policy", "unchanged"):
            return plan
        trial.set_user_attr("plan", mapped.model_dump(mode="json"))
        return mapped

    def prediction(self, plan: Plan) -> Prediction | None:
        """The estimate of ``plan`` (``None`` without one); each plan is predicted once."""
        if self.predict is None:
            return None
        if plan not in self._predictions:
            self._predictions[plan] = self.predict(plan)
        return self._predictions[plan]

    def _predicted(self, plan: Plan) -> Prediction:
        prediction = self.prediction(plan)
        assert prediction is not None
        return prediction

    def queue_neighbours(self, records: list[TrialRecord], notes: list[str]) -> bool:
        """Once the queue is drained, queue the best measured plan's neighbours that no trial
        has had and the estimate does not predict to miss the budget, measured whatever their
        predicted time: its micro-batch neighbours (the step-time model's split of a step into a
        fixed part per micro-batch and a part per sample comes from one process; a trial's
        engine and its ranks sharing a host's memory can rank micro-batches otherwise: on the
        124M grid here, bf16 ZeRO-0 ran 5.3 s per step at mb=1 ga=4 against 6.7 s at mb=4),
        and for a sharded best its twin at the lowest ZeRO stage predicted to fit (the model
        tells stages apart by under 1 % on a small model, where the engines' own costs
        decide: tiny Llama's bf16 mb=16 ran 142 samples/s at ZeRO-0 against 134 at ZeRO-2).
        Whether any was queued."""
        ranked = best_records(records)
        if not ranked or any(r.state == "waiting" for r in records):
            return False
        best, known = ranked[0].plan, {r.plan for r in records}
        queued = []
        for plan in [*self.space.neighbours(best), *self._lowest_stage(best)]:
            prediction = self.prediction(plan)
            if plan in known or (prediction is not None and not prediction.fits):
                continue
            _study.enqueue(self.study, self.space, plan, "neighbour")
            queued.append(plan)
        if queued:
            notes.append(f"neighbours of the best measured plan (trial {ranked[0].number}: "
                         "micro-batch, lowest ZeRO stage predicted to fit) queued, measured "
                         "whatever their prediction: "
                         + ", ".join(plan.describe() for plan in queued))  # fmt: skip
        return bool(queued)

    def _lowest_stage(self, best: Plan) -> list[Plan]:
        """``best`` at the lowest DeepSpeed ZeRO stage of the space below its own that is
        predicted to fit (``[]``: none, or no prediction to say)."""
        if best.engine != "deepspeed" or self.predict is None:
            return []
        params = self.space.params(best)
        for stage in sorted(s for s in self.space.zero_stages if s < best.zero_stage):
            plan = self.space.plan({**params, "zero_stage": stage})
            if self._predicted(plan).fits:
                return [plan]
        return []

    def worth_running(self, records: list[TrialRecord]) -> bool:
        """Whether a plan is left that is queued, or not yet measured and not predicted
        (to miss the budget, or to be slower than the best measured beyond the error bar)."""
        if self.predict is None or any(r.state in ("waiting", "running") for r in records):
            return True
        tried = {r.plan for r in records if r.outcome is not None}
        for plan in self.space.all_plans():
            prediction = self.prediction(plan)
            if plan in tried or (prediction is not None and not prediction.fits):
                continue
            if unpaid_knob(plan, self.space, self._predicted, records) is not None:
                continue
            if slower_than_best(prediction, records) is None:
                return True
        return False

    def step(self) -> TrialRecord:
        """Ask for one plan and decide it: pruned without running, or run and measured.

        The trial beats its heartbeat while it runs. An exception on the way (an
        interrupt included) gives the trial back: failed, and its plan queued again.
        """
        trial, plan, role = _study.ask(self.study, self.space)
        try:
            with _shared.Heartbeat(self.study, trial):
                return self._decide(trial, self._as_decided(trial, plan, role), role)
        except BaseException as exc:  # SIGINT, SIGTERM (Terminated), a lost storage, a bug
            with contextlib.suppress(Exception):
                _study.give_back(self.study, trial, _why_stopped(exc))
            raise

    def _decide(self, trial: Any, plan: Plan, role: str) -> TrialRecord:
        from optuna.trial import TrialState as State

        # Of two workers that drew one plan, the lower trial number runs it: know theirs first.
        _study.wait_for_earlier_plans(self.study, trial.number)
        others = [r for r in _study.records(self.study) if r.number != trial.number]
        prediction = self.prediction(plan)
        reason = self._skip_reason(plan, others, trial.number, prediction)
        if reason is None and role != "baseline":  # the user's plan is measured as it is
            reason = self._unpaid_reason(plan, role, others)
        if reason is None and role not in ("policy", "unchanged", "baseline", "neighbour"):
            reason = slower_than_best(prediction, others)
        fields: dict[str, Any] = (
            {"reason": reason} if reason is not None else self._measure(plan, role, others)
        )
        if prediction is not None:
            fields.update(predicted_peak_bytes=prediction.peak_bytes,
                          prediction_source=prediction.source,
                          predicted_step_ratio=prediction.step_time_ratio)  # fmt: skip
        _study.store(trial, fields)
        outcome = fields.get("outcome")
        value = fields.get("tokens_per_s") or fields.get("samples_per_s")
        if outcome == "ok" and value:
            self.study.tell(trial, value)
        elif outcome in ("timeout", "crash"):
            self.study.tell(trial, state=State.FAIL)
        else:
            self.study.tell(trial, state=State.PRUNED)
        record = _study.to_record(self.study._storage.get_trial(trial._trial_id))
        assert record is not None
        return record

    def _skip_reason(self, plan: Plan, others: list[TrialRecord], number: int,
                     prediction: Prediction | None) -> str | None:  # fmt: skip
        for other in others:
            done = other.state in ("complete", "pruned", "failed") and other.outcome is not None
            # Two workers asking for one plan at once: the lower trial number runs it.
            racing = other.state == "running" and other.number < number
            if other.plan == plan and (done or racing):
                return f"same plan as trial {other.number}"
        lesson = oom_lesson(plan, [r.plan for r in others if r.outcome == "oom"])
        if lesson is not None:
            return f"micro-batch {lesson.micro_batch} ran out of memory with the same knobs"
        if prediction is not None and not prediction.fits:
            return f"predicted not to fit: {prediction.reason or 'over the budget'}"
        return None

    def _unpaid_reason(self, plan: Plan, role: str, others: list[TrialRecord]) -> str | None:
        """Why ``plan`` is not run: a knob it turns buys nothing; its leaner twin is queued.

        Only the sampler's plans drop an unpaid ZeRO stage: the predicted front measures
        one plan per stage on purpose, and the policy chose its stage by its own rules.
        """
        if self.predict is None:
            return None
        unpaid = unpaid_knob(plan, self.space, self._predicted, others, stages=role == "search")
        if unpaid is None:
            return None
        queued: Role = "search" if role == "search" else "predicted"
        _study.enqueue(self.study, self.space, unpaid.twin, queued)
        return unpaid.reason

    def _measure(self, plan: Plan, role: str, others: list[TrialRecord]) -> dict[str, Any]:
        # Once a trial has swept the link, the others need not (~1 s each): one is used.
        update: dict[str, Any] = {} if self.link is None else {"sweep_link": False}
        behind = None if role == "baseline" else stop_slower_than(others)
        if behind is not None:
            update["stop_slower_than_s"] = behind[0]
        settings = self.settings.model_copy(update=update) if update else self.settings
        report = self.runner.run(plan, settings)
        outcome = classify_outcome(
            report.returncode, report.timed_out, report.result, report.stderr_tail
        )
        result = report.result
        fields: dict[str, Any] = {
            "outcome": outcome,
            "reason": outcome_reason(outcome, result, report.stderr_tail),
            "duration_s": report.duration_s,
            "stderr_tail": report.stderr_tail[-2000:] if outcome != "ok" else None,
        }
        if result is not None:
            fields.update(fixed_s=report.fixed_s, steps_s=result.steps_s,
                          reused_worker=result.reused)  # fmt: skip
        if result is not None and result.completed_steps > 0:
            fields.update(peak_memory_bytes=result.peak, peak_source=result.peak_source,
                          step_time=result.step_time, step_interval=result.step_interval,
                          steps_measured=len(result.step_times) or None)  # fmt: skip
            if outcome == "ok":
                fields.update(samples_per_s=result.samples_per_s, tokens_per_s=result.tokens_per_s)
        if result is not None and result.link is not None:
            fields["link"] = result.link.model_dump(mode="json")
        interval = result.step_interval if result is not None else None
        if outcome == "ok" and behind is not None and interval and interval[0] > behind[0]:
            count = len(result.step_times) if result is not None else 0
            fields["reason"] = (
                f"stopped after {count} measured step(s): the median's interval "
                f"({interval[0]:.3g}-{interval[1]:.3g} s) lay above {behind[0]:.3g} s, the top "
                f"of trial {behind[1]}'s (the best measured) and {RUN_SPREAD:.1%} between runs"
            )  # fmt: skip
        return fields


def tune(
    model_file: str,
    *,
    options: TuneOptions,
    machine: Machine,
    settings: TrialSettings,
    runner: TrialRunner,
    blocks: int = 0,
    policy: Plan | None = None,
    predict: Predict | None = None,
    relink: Callable[[LinkMeasure], Predict] | None = None,
    code_changes: Callable[[Plan], list[Any]] | None = None,
    progress: Callable[[Progress], None] | None = None,
    overhead_s: float = 0.0,
) -> TuneRecord:
    """Search plans with real short trials and recommend the fastest that fits.

    Args:
        model_file: the model every trial builds, as the record names it.
        options: what the run is asked (global batch, trials, budget, storage, study,
            repeats, baseline, engines, heartbeat, ...); see :class:`TuneOptions`.
        machine: ranks per node and nodes of each trial (ZeRO stages are searched when a
            trial has more than one rank; over nodes ``runner`` must be an
            :class:`AgentRunner`) and the budget the record reports.
        settings: steps, warm-up, device, budget and timeout of each trial
            (:func:`trial_settings`).
        runner: launches trials (:class:`PoolRunner`, or a fake in tests).
        blocks: L, the blocks of the model's stack (0: no checkpointing knob).
        policy: the policy's plan, run first; its other knobs hold for all trials.
        predict: the estimate; plans it says cannot fit are pruned, never run; its
            predicted front is measured early, and plans it predicts slower than the best
            measured one beyond its error bar are skipped.
        relink: ``link -> predict``: the estimate with communication timed on the link the
            first multi-rank trial swept between its ranks, used from then on.
        code_changes: ``plan -> [CodeChange]`` for the recommendation.
        progress: called after each trial.
        overhead_s: seconds this worker spent before the search (its profiles): with the
            start-up, counted in the share of the trials' time the final re-runs may take.

    Returns:
        The record of all trials, the final comparison and the recommendation.
    """
    began = time.monotonic()
    options.check_machine(machine)
    space = make_space(options.global_batch, machine.nproc_per_node, blocks, policy,
                       options.baseline, machine.nnodes, options.searched_engines())  # fmt: skip
    per_rank = options.global_batch // space.world
    base_plan = options.baseline or Plan(
        micro_batch=per_rank, nproc_per_node=machine.nproc_per_node, nnodes=machine.nnodes
    )
    name = options.study_name or "autotune"
    study = _study.open_study(options.storage, name, options.seed, options.heartbeat_s)
    notes: list[str] = []
    _shared.recover(study, notes)
    startup = trials_s = 0.0
    # SIGTERM unwinds like SIGINT: the running trial is given back, its group killed.
    with sigterm_unwinds():
        if not options.finish:
            # With several ranks the first trial sweeps the link: the front waits for it.
            later = relink is not None and settings.sweep_link and space.world > 1
            startup = _start(study, space, runner, settings, base_plan, notes, predict,
                             0 if later else options.front)  # fmt: skip
            mark = time.monotonic()
            search = _Search(study, space, runner, settings, predict, relink,
                             options.front if later else 0)  # fmt: skip
            _run_study(search, options.trials, options.budget_s, progress, notes)
            trials_s = time.monotonic() - mark
        records = _study.records(study)
        ranked = best_records(records)
        baseline = next((r for r in records if r.role == "baseline" and r.outcome == "ok"), None)
        if baseline is None:
            notes.append("the baseline did not run to completion: no speedup is reported")
        mark = time.monotonic()
        comparison = final_comparison(study, ranked, baseline, runner, settings,
                                      options.repeats, notes, overhead_s + startup)  # fmt: skip
        comparing = time.monotonic() - mark
    rec = recommendation(ranked, comparison, model_file, code_changes, notes)
    wall = WallTime.of(total_s=time.monotonic() - began, startup_s=startup, trials_s=trials_s,
                       comparison_s=comparing)  # fmt: skip
    tokens = any(r.tokens_per_s is not None for r in ranked)
    return TuneRecord(
        model_file=model_file, study=name, storage=_study.shown_storage(options.storage),
        global_batch=options.global_batch, nproc_per_node=machine.nproc_per_node, nnodes=machine.nnodes,
        device_memory=settings.device_memory, margin=machine.margin,
        objective="tokens_per_s" if tokens else "samples_per_s", trials=records,
        comparison=comparison, recommendation=rec, notes=notes, wall_time=wall,
        link=next((r.link for r in records if r.link is not None), None),
    )  # fmt: skip


def trial_settings(model_file: str, options: TuneOptions, machine: Machine,
                   memory_guard: int | None = None) -> TrialSettings:  # fmt: skip
    """What every trial of the study shares, from the run's options and its machine."""
    return TrialSettings(
        model_file=model_file, steps=options.steps, warmup=options.warmup,
        device=machine.device, device_memory=machine.device_memory,
        memory_guard=memory_guard, timeout_s=options.trial_timeout_s,
        interval_width=options.interval_width,
        max_steps=max(options.max_steps, options.steps),
    )  # fmt: skip


def _start(study: Any, space: SearchSpace, runner: TrialRunner, settings: TrialSettings,
           base_plan: Plan, notes: list[str], predict: Predict | None, front: int) -> float:  # fmt: skip
    """Queue the policy's plan, its twin with the model's code unchanged (where the policy
    changes it: :meth:`_Search.learn_code`), the baseline and ``front`` plans of the predicted
    front (0 where it waits for the link: :meth:`_Search.queue_front`); pay launcher start-up
    once.

    Returns:
        The seconds the launcher's start-up took (0 where it had nothing to start).
    """
    policy_plan, unpaid = leaner_plan(_fit_micro_batch(space, space.base), space, predict, [],
                                      stages=False)  # fmt: skip
    if unpaid is not None:
        notes.append(f"the policy's plan runs without what it does not need: {unpaid}")
    if policy_plan == base_plan:
        _study.enqueue(study, space, base_plan, "baseline")
    else:
        _study.enqueue(study, space, policy_plan, "policy")
        unchanged = unchanged_model(policy_plan)
        if unchanged is not None and unchanged != base_plan:
            _study.enqueue(study, space, unchanged, "unchanged")
        _study.enqueue(study, space, base_plan, "baseline")
        notes.extend(_policy_note(policy_plan, base_plan, predict))
    if predict is not None:
        _enqueue_front(study, space, predict, front)
    shapes = [base_plan, policy_plan] + (
        [space.plan({"micro_batch": 1, "zero_stage": 1})] if space.world > 1 else []
    )
    mark = time.monotonic()
    warm = runner.warm_up(shapes, settings)
    if warm:
        notes.append(f"launcher start-up paid once before the study: {warm:.1f} s (not trial time)")
    return time.monotonic() - mark


def _enqueue_front(study: Any, space: SearchSpace, predict: Predict, size: int) -> list[Plan]:
    """Queue ``size`` plans of the predicted front, each without the knobs it does not need
    (:func:`leaner_plan`, stages kept: the front measures one plan per stage); the plans."""
    plans = [leaner_plan(plan, space, predict, [], stages=False)[0]
             for plan in predicted_front(space, predict, size)]  # fmt: skip
    for plan in plans:
        _study.enqueue(study, space, plan, "predicted")
    return plans


def _policy_note(policy: Plan, baseline: Plan, predict: Predict | None) -> list[str]:
    """Why the policy's plan goes first although it is predicted slower than the baseline."""
    if predict is None:
        return []
    mine, theirs = predict(policy), predict(baseline)
    if mine.step_time_ratio is None or not theirs.step_time_ratio:
        return []
    ratio = mine.step_time_ratio / theirs.step_time_ratio
    if ratio <= 1.0:
        return []
    why = (f"it exists to fit: the baseline is predicted not to ({theirs.reason})"
           if not theirs.fits else "the baseline is predicted to fit, so nothing requires it")  # fmt: skip
    return [f"the policy's plan ({policy.describe()}) is predicted x{ratio:.2f} the baseline's "
            f"step time; {why}"]  # fmt: skip


def _run_study(search: _Search, trials: int, budget_s: float | None,
               progress: Callable[[Progress], None] | None, notes: list[str]) -> None:  # fmt: skip
    start = time.monotonic()
    asks = 0
    cap = 20 * trials + search.space.size()
    while asks < cap:
        _shared.recover(search.study, notes)
        left = None if budget_s is None else budget_s - (time.monotonic() - start)
        if left is not None and left <= 0:
            return
        if _done(search, trials):
            # Wait for the other workers' trials; run any lost one that comes back. One counted
            # in flight may end without a measure (pruned, given back): then the study is short.
            if _settle(search, notes) or not _done(search, trials):
                continue
            return
        existing = _study.records(search.study)
        search.learn_link(existing, notes)
        search.learn_code(existing, notes)
        search.queue_front(existing, notes)
        if search.queue_neighbours(existing, notes):
            existing = _study.records(search.study)
        if not search.worth_running(existing):
            # a trial another worker has just asked for (no plan yet) may measure a new best
            if _settle(search, notes) or search.worth_running(_study.records(search.study)):
                continue
            measured = sum(1 for r in existing if r.outcome is not None and r.state != "running")
            notes.append(f"stopped after {measured} measured trials: every plan not measured is "
                         "predicted not to fit or to be slower than the best measured beyond the "
                         "estimate's error bar")  # fmt: skip
            return
        record = search.step()
        asks += 1
        if progress is not None:
            all_records = _study.records(search.study)
            ranked = best_records(all_records)
            count = sum(1 for r in all_records if r.outcome is not None and r.role != "unchanged")
            left = None if budget_s is None else budget_s - (time.monotonic() - start)
            progress(Progress(count, trials, ranked[0] if ranked else None, record, left))


def _settle(search: _Search, notes: list[str]) -> bool:
    """Wait for the other workers' running trials, as long as any launch may take
    (:func:`autotune.search._shared.settle`): ``True`` when a lost one came back to run."""
    wait = 4 * search.settings.timeout_s + 3 * _study.heartbeat_interval(search.study)
    return _shared.settle(search.study, notes, wait)


def _done(search: _Search, trials: int) -> bool:
    """Enough trials measured or in flight, or every plan decided; no lost trial waiting to rerun.

    Trials other workers are running count: a study of T trials measures T, not T
    per worker. One of them that is lost comes back as a retry, and runs. The policy's
    unchanged-code twin does not count: it decides the policy's code change, and is no plan
    of the search's (on tiny Llama it took the 8th trial from the ZeRO-0 neighbour that a
    fresh grid measured best).
    """
    if _shared.retries_waiting(search.study):
        return False
    existing = _study.records(search.study)
    measured = sum(1 for r in existing
                   if (r.outcome is not None or r.state == "running") and r.role != "unchanged")  # fmt: skip
    # A trial failed without an outcome was given back (interrupted, killed): not decided.
    # Points of the space only (not the baseline or the policy's twin where they lie outside
    # it); once the search runs the model's code as written, a plan run with the policy's code
    # changes before counts as its twin.
    decided = {
        search.as_space_plan(r.plan)
        for r in existing
        if r.state in ("complete", "pruned") or (r.state == "failed" and r.outcome)
    }
    points = set(search.space.all_plans())
    return measured >= trials or len(decided & points) >= len(points)
