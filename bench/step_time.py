"""Predicted against measured seconds per optimizer step, across plans (issue 32).

Usage: OMP_NUM_THREADS=1 .venv/bin/python bench/step_time.py MODEL --nproc-per-node 2 \\
           --global-batch 8 --profile-batch 1 --measurements FILE [--rounds 2] [--profile PROFILE] \\
           [--grid "engines=zero0,zero1,zero2,zero3,fsdp2-2,fsdp2-3 precision=fp32,bf16 \\
                    ckpt=none,partial,full ga=1,4"] [--plans PLAN ...] [--tune-profiles] \\
           [--warmup 2] [--steps 3] [--print-only | --relink]

Predicted: ``estimate(plan).predicted_step_seconds`` of one profile (``--profile``, else FILE's
``.profile.json``, measured once); with ``--tune-profiles`` instead of tune's own two short
profiles at the per-rank batch (:func:`autotune.compose.short_profiles`: one process, the second's
timed steps on the first's model; FILE's ``.tune-profiles.json``, measured once), each phase
split into a fixed part per micro-batch and a part per sample from the two; on the link the
trials' ranks swept (as tune relinks). Measured:
each plan ``--rounds`` times in one live worker group, round r in an order rotated by r; a trial's
median seconds per step (``--steps`` after ``--warmup`` untimed: :data:`STEADY`, where FILE
keeps no timing of its own for the model). The grid is ``zero_peaks.grid_plans``'s plus ``zero0``;
without ``mb=``, mb = global batch / ranks / ga. FILE keeps each ok round's seconds and peak and
the first link, by model sha256 and plan JSON, written after every trial (the link also keeps each
engine's own cost, which the ranks measure after one trial where FILE's link lacks it, against
the kept link, which stays; ``--relink`` sweeps the link anew and measures every engine's cost
against that, both kept in their place); a plan with its rounds
there is not run again, so a run resumes and a changed estimate re-prints against the same
measurements; ``--print-only`` runs no trial at all (a plan FILE lacks shows no measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from zero_peaks import ENGINES, REPO, grid_plans

ENGINES.setdefault("zero0", "stage=0")  # grid_plans reads the table when called
MB_KEYS = ("mb", "micro_batch", "micro_batch_size")
STEADY = {"warmup": 2, "steps": 3}
"""A trial's untimed and timed steps, by default. DeepSpeed's ZeRO-3 often takes a slow second
step, which a median of two steps after one averages in: at micro-batch 4 on tiny GPT and tiny
Llama that reading came 2-53 % over the median of steps 4-12, 3 after 2 within -8 to +16 %
(bench/settle_steps.py, 4 repeats each). The time model predicts the settled step."""
BEFORE_STEADY = {"warmup": 1, "steps": 2}
"""How a kept entry that names no timing was measured (every file kept before stop 63)."""


def _refuse(message: str) -> NoReturn:
    print(f"autotune: {message}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _refuse(message)


def _arguments() -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--profile-batch", type=int, default=1)
    parser.add_argument("--tune-profiles", action="store_true",
                        help="predict from tune's own two short profiles at the per-rank batch "
                        "(one process; kept beside FILE) instead of one profile")  # fmt: skip
    parser.add_argument("--grid", help="engines=zero0,...,fsdp2-3 precision=... ckpt=... ga=... mb=...")  # fmt: skip
    parser.add_argument("--plans", nargs="+", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measurements", type=Path, required=True, help="JSON file, kept and reused")  # fmt: skip
    parser.add_argument("--profile", type=Path, help="a saved ProfileRecord JSON (default: measure)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900, help="seconds per trial")
    parser.add_argument("--warmup", type=int,
                        help=f"untimed steps per trial (default {STEADY['warmup']}; a kept file "
                        "keeps its own)")  # fmt: skip
    parser.add_argument("--steps", type=int,
                        help=f"timed steps per trial, their median kept (default "
                        f"{STEADY['steps']}; a kept file keeps its own)")  # fmt: skip
    parser.add_argument("--relink", action="store_true",
                        help="sweep the link anew and measure the engines' costs against it, "
                        "both kept in place of the kept ones (default: the costs of engines "
                        "not measured yet, against the kept link)")  # fmt: skip
    parser.add_argument("--print-only", action="store_true",
                        help="run no trial: print this commit's predictions against the kept "
                        "measurements (plans without them show no measurement)")  # fmt: skip
    args = parser.parse_args()
    check_arguments(args)
    if not args.plans and not args.grid:
        _refuse("--grid / --plans: give at least one")
    return args


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse (exit 2, the flag named) a missing model file, a count below 1 or no folder for
    ``--measurements``: the checks every script measuring plans this way shares."""
    if not Path(args.model).is_file():
        _refuse(f"MODEL {args.model}: no such model file")
    for flag in ("nproc_per_node", "global_batch", "profile_batch", "rounds"):
        if getattr(args, flag) < 1:
            _refuse(f"--{flag.replace('_', '-')}: must be >= 1 (got {getattr(args, flag)})")
    for flag, least in (("warmup", 0), ("steps", 1)):
        value = getattr(args, flag, None)
        if value is not None and value < least:
            _refuse(f"--{flag}: must be >= {least} (got {value})")
    if not args.measurements.parent.is_dir():
        _refuse(f"--measurements {args.measurements}: no folder {args.measurements.parent}")
    if args.relink and args.print_only:  # every caller sets --relink (grid_124m: False)
        _refuse("--relink: sweeps the link on the ranks, and --print-only runs nothing")


def make_plans(args: argparse.Namespace, blocks: int | None) -> list[Any]:
    """The plans of ``--plans`` then ``--grid``, each once; without an ``mb`` the micro-batch
    is ``--global-batch`` / ranks / ga. ``blocks``: L, ``None`` before it is known (a check).

    Raises:
        AutotuneError: a bad plan or grid text, or a global batch that does not divide, naming the flag.
    """
    from autotune.records import AutotuneError, Plan, parse_plan

    texts = [(text, "--plans", any(f"{k}=" in text for k in MB_KEYS)) for text in args.plans]
    if args.grid:
        try:
            grid = grid_plans(args.grid, blocks or 2)
        except ValueError as error:
            raise AutotuneError(str(error)) from None
        given = any(item.startswith("mb=") for item in args.grid.split())
        texts += [(text, "--grid", given) for text in grid]
    plans: list[Any] = []
    for text, flag, given in texts:
        plan = parse_plan(
            text, Plan(nproc_per_node=args.nproc_per_node), flag, blocks=blocks or "later"
        )
        if not given:
            samples = plan.world_size * plan.grad_accum
            if args.global_batch % samples:
                raise AutotuneError(f"--global-batch {args.global_batch}: not a multiple of "
                                    f"{plan.world_size} ranks x ga={plan.grad_accum}")  # fmt: skip
            plan = plan.with_changes(micro_batch=args.global_batch // samples)
        plans += [plan] if plan not in plans else []
    return plans


def prepare(args: argparse.Namespace) -> tuple[str, str, Any, dict[str, Any]]:
    """The model's path and sha256, its kept profile (``None``: to measure) and the kept
    measurements; a bad plan, grid, profile or measurements file refused (exit 2) before any
    expensive work."""
    from autotune.records import AutotuneError, read_json

    model = str(Path(args.model).resolve())
    sha = hashlib.sha256(Path(model).read_bytes()).hexdigest()
    try:
        make_plans(args, blocks=None)  # every text checked before any profiling; L is known after
        record = _kept_profile(args, sha)
        kept = read_json(args.measurements, "measurements") if args.measurements.exists() else {}
    except AutotuneError as error:
        _refuse(str(error))
    return model, sha, record, kept


def timing(args: argparse.Namespace, entry: dict[str, Any]) -> dict[str, int]:
    """The untimed and timed steps of ``entry``'s trials: the entry's own (one that keeps
    measurements but names none: :data:`BEFORE_STEADY`), else ``--warmup`` / ``--steps``
    (:data:`STEADY` where not given). A flag that differs from the entry's own is refused (exit
    2): one file's rounds are timed alike."""
    asked = {flag: getattr(args, flag) for flag in STEADY if getattr(args, flag, None) is not None}
    own = entry.get("timing") or (BEFORE_STEADY if entry.get("seconds") else None)
    if own is None:
        return {**STEADY, **asked}
    for flag, value in asked.items():
        if own[flag] != value:
            _refuse(f"--{flag} {value}: {args.measurements} keeps this model's trials timed at "
                    f"{own['warmup']} warm-up and {own['steps']} timed steps; give those, or "
                    "another file")  # fmt: skip
    return dict(own)


def profiled_plans(args: argparse.Namespace, model: str, record: Any) -> tuple[Any, list[Any]]:
    """The profile (``record``, else one measured now) and the plans at its block count."""
    record = record or _profile(args, model)
    stack = record.model.block_stack
    return record, make_plans(args, stack.count if stack else 1)


def _kept_profile(args: argparse.Namespace, sha: str) -> Any:
    """``--profile``, else the profile kept beside the measurements if of this model file."""
    from autotune.records import ProfileRecord, read_record

    path = args.profile or args.measurements.with_suffix(".profile.json")
    if not path.exists():
        return None
    record = read_record(path, ProfileRecord, "profile")
    if record.provenance.model_sha256 != sha and args.profile is None:
        return None  # the model file changed: profile it again
    print(f"profile: {path} (micro-batch {record.config.batch_size})")
    return record


def _profile(args: argparse.Namespace, model: str) -> Any:
    """A fresh profile, saved beside the measurements (the prediction reproducible)."""
    from autotune import compose
    from autotune.records import write_record

    print(f"profiling {Path(model).name} at micro-batch {args.profile_batch} ...", flush=True)
    record = compose.profile_model(model, batch_size=args.profile_batch, steps=3, warmup=1,
                                   device="cpu")  # fmt: skip
    print(f"profile: {write_record(args.measurements.with_suffix('.profile.json'), record)}")
    return record


def tune_profiles(args: argparse.Namespace, model: str, sha: str) -> Any:
    """``None``, or with ``--tune-profiles`` tune's own two short profiles at the per-rank batch
    (the profile carrying the timed steps after it where there are any): kept beside the
    measurements (by model sha256), else measured now and kept."""
    if not getattr(args, "tune_profiles", False):
        return None
    per_rank = max(1, args.global_batch // args.nproc_per_node)
    return kept_tune_profiles(args.measurements.with_suffix(".tune-profiles.json"), model, sha,
                              per_rank)  # fmt: skip


def kept_tune_profiles(path: Path, model: str, sha: str, per_rank: int) -> Any:
    """Tune's two short profiles of ``model`` (sha256 ``sha``) at ``per_rank``, as kept in
    ``path`` (the profile and its timed second micro-batch apart, ``timed``); where it keeps
    another model's or batch's, taken now and kept there. Returns the profile carrying the
    second, as :func:`autotune.compose.short_profiles` gives it."""
    from autotune.records import ProfileRecord, TimedSteps

    kept = json.loads(path.read_text()) if path.exists() else {}
    if kept.get("model_sha256") != sha or kept.get("per_rank") != per_rank:
        from autotune import compose

        print(f"tune's short profiles of {Path(model).name} at per-rank batch {per_rank} ...",
              flush=True)  # fmt: skip
        record = compose.short_profiles(model, per_rank, "cpu")
        timed = record.second
        kept = {"model_sha256": sha, "per_rank": per_rank,
                "profile": record.model_copy(update={"second": None}).model_dump(mode="json"),
                "timed": timed.model_dump(mode="json") if timed else None}  # fmt: skip
        _save(path, kept)
    print(f"tune's short profiles: {path} (per-rank batch {per_rank})")
    timed = TimedSteps.model_validate(kept["timed"]) if kept["timed"] else None
    return ProfileRecord.model_validate(kept["profile"]).model_copy(update={"second": timed})


def _link(link: Any) -> str:
    return f"{link.latency_s * 1e6:.0f} us + {link.gbps:.3g} Gbit/s bus ({link.backend})"


def _save(path: Path, kept: dict[str, Any]) -> None:
    """Whole or not at all (an interrupt mid-write keeps the last file)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(kept, indent=1))
    partial.replace(path)


def trials_to_run(plans: list[Any], seconds: dict[str, list[float]], rounds: int) -> int:
    """The trials left before each plan has ``rounds`` kept rounds in ``seconds``."""
    return sum(max(0, rounds - len(seconds.get(plan.model_dump_json(), []))) for plan in plans)


def measure(args: argparse.Namespace, model: str, plans: list[Any], entry: dict[str, Any],
            kept: dict[str, Any]) -> dict[str, str]:  # fmt: skip
    """Run each plan until it has ``--rounds`` rounds in ``entry`` (round r rotated by r).

    ``entry["seconds"]`` keeps each ok round's seconds per step and ``entry["peaks"]`` its peak
    (the largest rank's bytes), by plan JSON. Returns why each plan that failed this time did.
    """
    from autotune.estimator import engine_keys
    from autotune.records import LinkMeasure
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import PoolRunner, TrialSettings
    from autotune.search._outcome import classify_outcome

    seconds, peaks = entry.setdefault("seconds", {}), entry.setdefault("peaks", {})
    todo = trials_to_run(plans, seconds, args.rounds)
    print(f"{len(plans)} plans, {todo} trials to run ({len(plans) * args.rounds - todo} kept in "
          f"{args.measurements})", flush=True)  # fmt: skip
    failed: dict[str, str] = {}
    keys = engine_keys(plans)
    measured = {cost["engine"] for cost in (entry.get("link") or {}).get("engine_costs", [])}
    calibrate = args.relink or not set(keys) <= measured
    if not todo and not calibrate:
        return failed
    known = (LinkMeasure.model_validate(entry["link"])
             if entry.get("link") and not args.relink else None)  # fmt: skip
    entry["timing"] = timing(args, entry)
    settings = TrialSettings(model_file=model, **entry["timing"], device="cpu",
                             timeout_s=args.timeout, engine_costs=keys, known_link=known)  # fmt: skip
    done = 0
    with tempfile.TemporaryDirectory() as tmp, PoolRunner(entry_points=ENTRY_POINTS, workdir=Path(tmp)) as pool:  # fmt: skip
        print(f"worker group of {args.nproc_per_node} ranks started in "
              f"{pool.warm_up(plans[:1], settings):.0f} s", flush=True)  # fmt: skip
        if calibrate:  # the kept link predates these engines' costs, or is swept anew
            what = "against the kept link" if known else "and the link"
            print(f"{len(keys)} engines' own costs {what}, after a trial of "
                  f"{plans[0].describe()} ... ", end="", flush=True)  # fmt: skip
            result = pool.run(plans[0], settings).result
            if result is None or result.link is None:
                _refuse("the calibration trial measured no link")
            # a kept link (swept with the measurements) stays theirs: the costs were measured
            # against it, as tune measures them against the link it predicts with
            entry["link"] = result.link.model_dump(mode="json")
            print(_link(result.link), flush=True)
            _save(args.measurements, kept)
        if entry.get("link"):  # kept, or just swept: the trials need not sweep again
            settings = settings.model_copy(
                update={"sweep_link": False, "engine_costs": [], "known_link": None}
            )
        for index in range(args.rounds):
            shift = index % len(plans)
            for plan in plans[shift:] + plans[:shift]:
                key = plan.model_dump_json()
                runs = seconds.setdefault(key, [])
                if len(runs) > index:
                    continue
                done += 1
                print(f"[{done}/{todo}] round {index + 1}: {plan.describe()} ... ", end="", flush=True)  # fmt: skip
                run = pool.run(plan, settings)
                result = run.result
                outcome = classify_outcome(run.returncode, run.timed_out, result, run.stderr_tail)
                if outcome != "ok" or result is None or result.step_time is None:
                    last = [line for line in run.stderr_tail.splitlines() if line.strip()][-1:]
                    failed[key] = f"{outcome}: {(result and result.error) or ''.join(last)[:160]}"
                    print(failed[key])
                    continue
                failed.pop(key, None)
                print(f"{result.step_time:.3f} s/step ({run.duration_s:.0f} s)", flush=True)
                runs.append(result.step_time)
                if result.peak is not None:
                    peaks.setdefault(key, []).append(result.peak)
                if not entry.get("link") and result.link is not None:
                    entry["link"] = result.link.model_dump(mode="json")
                    print(f"link swept by the ranks: {_link(result.link)}")
                _save(args.measurements, kept)
    return failed


def rank_correlation(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (scipy is not in the venv): Pearson's r of the ranks, tied values at
    their mean rank, as ``scipy.stats.spearmanr``; ``None`` where either side is constant."""

    def ranks(values: list[float]) -> list[float]:
        order = sorted(values)
        return [order.index(value) + (order.count(value) - 1) / 2 for value in values]

    rx, ry = ranks(xs), ranks(ys)
    return statistics.correlation(rx, ry) if len(set(rx)) > 1 and len(set(ry)) > 1 else None


def print_table(composition: Any, plans: list[Any], seconds: dict[str, list[float]]) -> None:
    """The table, the plans without a prediction or a measurement, and the error statistics."""
    print("\n| plan | predicted s/step | measured s/step: median [min, max] | error % "
          "| predicted samples/s/device | measured samples/s/device |\n|---|---|---|---|---|---|")  # fmt: skip
    pairs: list[tuple[float, float, float]] = []
    unpredicted: list[str] = []
    unmeasured: list[str] = []
    for plan in plans:
        est, runs = composition.estimate(plan), seconds.get(plan.model_dump_json(), [])
        predicted, samples = est.predicted_step_seconds, plan.micro_batch * plan.grad_accum
        measured = statistics.median(runs) if runs else None
        error = predicted / measured - 1 if predicted and measured else None
        cells = [
            plan.describe(),
            f"{predicted:.3f}" if predicted else "–",
            f"{measured:.3f} [{min(runs):.3f}, {max(runs):.3f}] ({len(runs)})" if measured else "–",
            f"{100 * error:+.1f}" if error is not None else "–",
            f"{est.samples_per_s_per_device:.2f}" if predicted else "–",
            f"{samples / measured:.2f}" if measured else "–",
        ]
        print("| " + " | ".join(cells) + " |")
        if predicted is None:
            unpredicted.append(f"{plan.describe()}: {est.time_source}; {'; '.join(est.notes)}")
        elif measured is None:
            unmeasured.append(plan.describe())
        else:
            pairs.append((predicted, measured, predicted / measured - 1))
    print(f"\n{len(unpredicted)} plans without a prediction (left out):")
    print("".join(f"  {line}\n" for line in unpredicted), end="")
    print(f"{len(unmeasured)} plans without an ok measurement: {', '.join(unmeasured) or '–'}")
    if not pairs:
        return
    from autotune.estimator import STEP_SECONDS_BAND

    low, high = STEP_SECONDS_BAND
    inside = sum(low <= m / p <= high for p, m, _ in pairs)
    size = sorted(abs(error) for _, _, error in pairs)
    rho = rank_correlation([p for p, _, _ in pairs], [m for _, m, _ in pairs])
    p90 = size[min(len(size) - 1, round(0.9 * (len(size) - 1)))]
    print(f"{len(pairs)} plans compared: |error| median {100 * statistics.median(size):.1f} %, "
          f"p90 {100 * p90:.1f} %; Spearman rank correlation of predicted and measured seconds "
          f"{'–' if rho is None else f'{rho:.3f}'}")  # fmt: skip
    above = sum(m / p > high for p, m, _ in pairs)
    print(f"{inside} of {len(pairs)} measured inside the predicted interval (x{low:g} to "
          f"x{high:g} the predicted seconds), {above} above it, {len(pairs) - inside - above} below")  # fmt: skip


def print_recompute(composition: Any, plans: list[Any], seconds: dict[str, list[float]]) -> None:
    """What checkpointing costs, predicted against measured: each measured plan with blocks
    checkpointed less its measured twin without, the medians and the range per precision."""
    gaps: dict[str, list[tuple[float, float]]] = {}
    for plan in plans:
        twin = plan.with_changes(checkpoint_blocks=0)
        if not plan.checkpoint_blocks or twin not in plans:
            continue
        runs, twin_runs = (seconds.get(p.model_dump_json(), []) for p in (plan, twin))
        predicted = [composition.estimate(p).predicted_step_seconds for p in (plan, twin)]
        if runs and twin_runs and None not in predicted:
            measured = statistics.median(runs) - statistics.median(twin_runs)
            gaps.setdefault(plan.precision, []).append((predicted[0] - predicted[1], measured))
    for precision, pairs in gaps.items():
        predicted, measured = [p for p, _ in pairs], [m for _, m in pairs]
        print(f"checkpointing at {precision}, {len(pairs)} plans less their twins without: "
              f"predicted {statistics.median(predicted):.3f} s a step (median), measured "
              f"{statistics.median(measured):.3f} s [{min(measured):.3f}, {max(measured):.3f}]")  # fmt: skip


def _provenance() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")  # fmt: skip
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "autotune"], capture_output=True, text=True)  # fmt: skip
    changed = " (autotune/ has uncommitted changes)" if dirty.stdout else ""
    return f"CPU: {cpu} ({os.cpu_count()} cores); git {head.stdout.strip()}{changed}"


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


@contextlib.contextmanager
def exits(measurements: Path) -> Iterator[None]:
    """An AutotuneError ends the run with its line (exit 1), Ctrl-C with 130, the rounds kept."""
    from autotune.records import AutotuneError

    try:
        yield
    except AutotuneError as error:
        print(f"autotune: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"\ninterrupted; the rounds measured are kept in {measurements}", file=sys.stderr)
        sys.exit(130)


def footer(load: str, started: float) -> None:
    """The load average, the run's seconds, the command and the provenance."""
    print(f"load average (1/5/15 min): {load} at start, {_load()} at end; "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print(f"command: {' '.join(sys.argv)}")
    print(_provenance())


def main() -> None:
    args = _arguments()
    from autotune import compose
    from autotune.records import LinkMeasure, Machine

    started, load = time.monotonic(), _load()
    model, sha, record, kept = prepare(args)
    with exits(args.measurements):
        entry = kept.setdefault(sha, {"model": model})
        steps = timing(args, entry)  # a flag at odds with the kept file refused before profiling
        record, plans = profiled_plans(args, model, record)
        if not args.print_only:
            measure(args, model, plans, entry, kept)
    machine = Machine(device="cpu", nproc_per_node=args.nproc_per_node)
    record = tune_profiles(args, model, sha) or record
    composition = compose.compose(record, machine=machine)
    if entry.get("link") is not None:
        swept = LinkMeasure.model_validate(entry["link"])
        composition = composition.on_link(swept)
        print(f"communication timed on the link the ranks swept: {_link(swept)}")
    print(f"model {Path(model).name} ({record.model.parameters:,} parameters), profiled at "
          f"micro-batch {record.config.batch_size}"
          f"{f' and timed at {record.second.config.batch_size}' if record.second else ''}; "
          f"{args.nproc_per_node} ranks on cpu")  # fmt: skip
    for figure, why in record.flags.items():
        print(f"profile flag {figure}: {why}")
    print(f"each trial's seconds: the median of {steps['steps']} steps after {steps['warmup']} "
          "untimed")  # fmt: skip
    print_table(composition, plans, entry.get("seconds", {}))
    print_recompute(composition, plans, entry.get("seconds", {}))
    footer(load, started)


if __name__ == "__main__":
    main()
