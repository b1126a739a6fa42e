"""Per-rank peak of DeepSpeed ZeRO and FSDP2 plans: predicted, against torch's instrument inside each rank.

For each plan, per rank:
- predicted: ``autotune estimate`` from one single-process profile of the model file;
- reference: torch's own instrument inside the rank over one optimizer step after warm-up, the
  same for both engines (``bench/_zero_rank.py``): on CPU the bytes alive at the step's start
  plus the profiler's allocation events of c10 replayed (shown ``low–high`` where a block was
  freed on a thread the profiler does not see, at a time no event tells; an error is then to
  the nearer bound, 0 inside); on CUDA ``torch.cuda.max_memory_allocated``. A rank whose reference did not run says "no
  reference" and is left out of every figure;
- trial: the live-tensor tracker of autotune's trial (``SubprocessRunner``), what ``autotune
  tune`` decides fit on, shown beside the reference (``--no-trial`` skips it);
- with ``--categories``, torch's categorised memory timeline's peak and categories (CPU).

Plans come from ``--plans`` or a ``--grid`` (:func:`grid_plans`). Under the table: the share of
rank rows under-predicted, the median / p95 / max |error| and the worst under-prediction.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/zero_peaks.py examples/tiny_llama.py --profile-batch 2 \\
         --grid "engines=zero1,zero2,zero3,fsdp2-2,fsdp2-3 precision=fp32,bf16 ckpt=none,partial,full ga=1,4 mb=2"
Each plan runs in ranks of its own unless ``--plans-per-job`` groups them (an earlier plan's
storages are not counted in a later one's start; a ZeRO-3 engine keeps its hooks, so put it last).

``--references FILE`` keeps each plan's rank references in FILE (JSON, written after every rank
job) and reuses those already there: a long grid can be resumed, and a changed estimate printed
against the same measurements without running the ranks again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the profiler reference lives with the tests
sys.path.insert(0, str(REPO / "bench"))

MIB = 2**20
ENGINES = {"zero1": "stage=1", "zero2": "stage=2", "zero3": "stage=3",
           "fsdp2-2": "engine=fsdp2,stage=2", "fsdp2-3": "engine=fsdp2,stage=3"}  # fmt: skip
GRID_KEYS = ("engines", "precision", "ckpt", "ga", "mb")
NO_REFERENCE = "no reference"


def grid_plans(spec: str, blocks: int) -> list[str]:
    """The plan texts of a grid: ``engines=zero1,fsdp2-3 precision=fp32,bf16 ckpt=none,partial,full
    ga=1,4 mb=2`` (every key optional but ``engines``), in that nesting order.

    ``ckpt`` takes ``none`` (0 blocks), ``partial`` (half of the ``blocks``, rounded down, at
    least 1) and ``full`` (all), or a number of blocks.

    Raises:
        ValueError: an unknown key, engine or checkpointing name, naming it.
    """
    axes: dict[str, list[str]] = {"precision": ["fp32"], "ckpt": ["none"], "ga": ["1"], "mb": ["2"]}
    for item in spec.split():
        key, _, values = item.partition("=")
        if key not in GRID_KEYS or not values:
            raise ValueError(f"--grid: {item!r}: keys are {', '.join(GRID_KEYS)} (KEY=V1,V2)")
        axes[key] = values.split(",")
    if "engines" not in axes:
        raise ValueError("--grid needs engines=... (" + ", ".join(ENGINES) + ")")
    depth = {"none": 0, "partial": max(1, blocks // 2), "full": blocks}
    plans = []
    for engine, precision, ckpt, ga, mb in itertools.product(
        axes["engines"], axes["precision"], axes["ckpt"], axes["ga"], axes["mb"]
    ):
        if engine not in ENGINES:
            raise ValueError(f"--grid: unknown engine {engine!r} ({', '.join(ENGINES)})")
        if ckpt not in depth and not ckpt.isdigit():
            raise ValueError(f"--grid: ckpt {ckpt!r}: none, partial, full or a block count")
        count = depth[ckpt] if ckpt in depth else int(ckpt)
        plans.append(f"{ENGINES[engine]},precision={precision},ckpt={count},ga={ga},mb={mb}")
    return plans


def bounded_error(figure: float, low: float, high: float) -> float:
    """``figure`` against a reference known to lie in ``[low, high]``: 0 inside, else the
    relative distance to the nearer bound (negative: below it)."""
    if figure < low:
        return figure / low - 1
    if figure > high:
        return figure / high - 1
    return 0.0


def summary(errors: Sequence[float]) -> dict[str, float]:
    """The under-prediction line of rank rows' errors (prediction / reference - 1)."""
    size = sorted(abs(error) for error in errors)
    under = [error for error in errors if error < 0]
    return {
        "rows": len(errors),
        "under_share": len(under) / len(errors),
        "median": statistics.median(size),
        "p95": size[min(len(size) - 1, round(0.95 * (len(size) - 1)))],
        "max": size[-1],
        "worst_under": min(under, default=0.0),
    }


def _kept(path: Path | None, nproc: int) -> dict[str, list[dict[str, Any] | None]]:
    """The rank references ``--references`` holds, by plan; only complete ones are reused."""
    if path is None or not path.exists():
        return {}
    kept = json.loads(path.read_text())  # read once by _arguments already
    return {plan: ranks for plan, ranks in kept.items() if len(ranks) == nproc and all(ranks)}


def _reference_jobs(
    model: str, plans: list[Any], nproc: int, work: Path, options: argparse.Namespace
) -> list[list[dict[str, Any] | None]]:
    """Each plan's per-rank reference: kept in ``--references``, else from rank jobs of
    ``--plans-per-job`` plans each (the file rewritten after every job)."""
    kept = _kept(options.references, nproc)
    todo = [plan for plan in plans if plan.describe() not in kept]
    if len(todo) < len(plans):
        print(f"{len(plans) - len(todo)} plans' references kept in {options.references}; "
              f"{len(todo)} to run", file=sys.stderr)  # fmt: skip
    size = options.plans_per_job
    for index in range(0, len(todo), size):
        group = todo[index : index + size]
        print(f"rank job {index // size + 1} of {-(-len(todo) // size)}: "
              f"{[p.describe() for p in group]}", file=sys.stderr, flush=True)  # fmt: skip
        job = work / f"job{index}.json"
        job.write_text(json.dumps({
            "model": model, "plans": [plan.model_dump_json() for plan in group],
            "device": options.device, "categories": options.categories,
        }))  # fmt: skip
        out = work / f"out{index}.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", f"--log-dir={work / 'torchrun'}", __file__,
            "--rank-worker", str(job), str(out),
        ]  # fmt: skip
        if _run_ranks(command, options.timeout) and out.exists():
            ranks = json.loads(out.read_text())
            kept.update({p.describe(): [rank[at] for rank in ranks] for at, p in enumerate(group)})
            if options.references is not None:  # whole or not at all
                partial = options.references.with_suffix(".partial")
                partial.write_text(json.dumps(kept, indent=1))
                partial.replace(options.references)
        else:
            print(f"rank job of {[p.describe() for p in group]} failed: {NO_REFERENCE}",
                  file=sys.stderr)  # fmt: skip
    return [kept.get(plan.describe(), [None] * nproc) for plan in plans]


_INSTRUMENT_ABORTS = 2
"""Reruns of a rank job that a C++ ``terminate`` (no exception: a thread of torch's profiler or
gloo torn down) ended: seen in about 1 run in 3 of the FSDP2 jobs on an AVX-512 CPU, after the
profiled steps; a failure of the instrument, not of the plan, so the job is run again."""


def _run_ranks(command: list[str], timeout: float, stdout: int | None = subprocess.DEVNULL) -> bool:
    """Run one rank job; rerun it where the instrument, not the plan, aborted. True if it ran.

    The job runs in a process group of its own, ended whole at the timeout or on an interrupt,
    and through autotune's lifeline, as a trial's launch: torchrun dies with this process, and
    each rank that calls ``die_with_parent`` first dies with torchrun (torchrun starts every rank
    in a session of its own, out of reach of the group's kill). Its standard output goes to
    ``stdout`` (``None``: this process's). A build lock that a killed job left in the extensions
    folder is removed first, with a line that says so (a DeepSpeed start would wait on it
    silently, forever).
    """
    from autotune.runtime.extensions import recover_build_locks
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.runtime.trial.lifeline import ENV

    guarded = [sys.executable, "-m", ENTRY_POINTS.lifeline, *command]
    env = {**os.environ, ENV: str(os.getpid())}
    recover_build_locks(env)  # a rank job killed mid-build (its CPU Adam) left one: say, clear
    for attempt in range(_INSTRUMENT_ABORTS + 1):
        job = subprocess.Popen(guarded, stdout=stdout, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)  # fmt: skip
        try:
            _, stderr = job.communicate(timeout=timeout)
        except BaseException:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            print(f"rank job stopped (over {timeout:.0f} s or interrupted)", file=sys.stderr)
            return False
        if job.returncode == 0:
            return True
        sys.stderr.write(stderr[-3000:])
        if "terminate called without an active exception" not in stderr:
            return False
        print(f"rank job aborted in a C++ terminate (attempt {attempt + 1}); running it again",
              file=sys.stderr)  # fmt: skip
    return False


def rank_job(rank: Callable[[str, str], None]) -> bool:
    """Where this process is a rank of a job :func:`_run_ranks` started (``--rank-worker JOB
    OUT``): guard it to die with torchrun (which starts it in a session of its own, out of reach
    of the job's kill), run ``rank(JOB, OUT)`` and return True; else False."""
    if sys.argv[1:2] != ["--rank-worker"]:
        return False
    from autotune.runtime.trial.lifeline import die_with_parent

    die_with_parent()
    rank(sys.argv[2], sys.argv[3])
    return True


def _zero_rank_main(job_path: str, out_path: str) -> None:
    from _zero_rank import rank_main

    rank_main(job_path, out_path)


def _trial_peaks(model: str, plans: list[Any], work: Path, nproc: int) -> list[list[int | None]]:
    """The trial tracker's per-rank peaks; ``None`` where the trial did not complete."""
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import SubprocessRunner, TrialSettings

    runner = SubprocessRunner(
        entry_points=ENTRY_POINTS, env={"OMP_NUM_THREADS": "1"}, workdir=work / "trials"
    )
    # the tracked step is the fourth, as the reference's in each rank (stage 3 steady state)
    settings = TrialSettings(model_file=model, steps=2, warmup=1, device="cpu", timeout_s=1800)
    peaks: list[list[int | None]] = []
    for plan in plans:
        report = runner.run(plan, settings)
        if report.result is None or not report.result.peak_memory_bytes:
            print(f"trial of {plan.describe()} failed: {report.stderr_tail[-800:]}",
                  file=sys.stderr)  # fmt: skip
            peaks.append([None] * nproc)
        else:
            peaks.append(list(report.result.peak_memory_bytes))
    return peaks


def _gloo_mode(plan: Any, predicted: int, reference: int, parameters: int) -> bool:
    """A ZeRO-1/2 rank read one fp32 gradient partition (4 * parameters / N) above the estimate:
    gloo's all-reduce work object still holds DeepSpeed's flattened bucket when the partition
    is allocated (bench/RESULTS.md, "ZeRO-1/2 per-rank peaks move by one gradient partition").
    Within a tenth of a partition: at 124M the loss's two logits-sized buffers (196 MiB) come
    within a sixth of one (236 MiB) and are another cause."""
    if plan.engine != "deepspeed" or plan.zero_stage not in (1, 2):
        return False
    partition = 4 * parameters / plan.world_size
    return abs(reference - predicted - partition) <= 0.1 * partition


def _mib(value: int | None) -> str:
    return "–" if value is None else f"{value / MIB:.2f}"


def _print_table(rows: list[dict[str, Any]], categories: bool) -> list[float]:
    """The markdown table, one row per plan and rank; returns the errors of rows with a reference."""
    head = "| plan | rank | predicted MiB | reference MiB | predicted vs reference | trial tracker MiB | tracker vs reference |"
    print(
        "\n"
        + head
        + (" timeline MiB | timeline's categories at its peak (MiB) |" if categories else "")
    )
    print("|---" * (7 + 2 * categories) + "|")
    errors = []
    for row in rows:
        reference, trial, predicted = row["reference"], row["trial"], row["predicted"]
        shown = _mib(reference)
        if reference is None:
            error = tracker = NO_REFERENCE
        else:
            low = row["low"]
            shown = shown if low == reference else f"{_mib(low)}–{shown}"
            errors.append(bounded_error(predicted, low, reference))
            error = f"{100 * errors[-1]:+.1f}%" + (" (gloo partition)" if row["gloo"] else "")
            tracker = (
                "–" if trial is None else f"{100 * bounded_error(trial, low, reference):+.1f}%"
            )
        cells = [row["plan"], str(row["rank"]), _mib(predicted), shown, error,
                 _mib(trial), tracker]  # fmt: skip
        if categories:
            parts = ", ".join(
                f"{name} {size / MIB:.2f}" if isinstance(size, int) else f"{name}: {size}"
                for name, size in row["at_peak"].items() if size
            )  # fmt: skip
            cells += [_mib(row["timeline"]), parts or "–"]
        print("| " + " | ".join(cells) + " |")
    return errors


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--plans", nargs="+", default=[])
    parser.add_argument(
        "--grid", help="engines=zero1,...,fsdp2-3 precision=... ckpt=... ga=... mb=..."
    )
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--profile-batch", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--plans-per-job", type=int, default=1)
    parser.add_argument("--no-trial", action="store_true", help="no trial tracker column")
    parser.add_argument("--road", choices=("profile", "model-file"), default="profile",
                        help="predict from a profile's composition (default) or from the model "
                        "file's trace alone, as `autotune estimate MODEL` does")  # fmt: skip
    parser.add_argument("--categories", action="store_true",
                        help="torch's categorised timeline beside the reference (CPU; its event "
                        "record with shapes and stacks needs far more memory)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per rank job")
    parser.add_argument("--references", type=Path,
                        help="JSON file keeping the rank references: reused where present, "
                        "written after every rank job")  # fmt: skip
    args = parser.parse_args()
    if not args.plans and not args.grid:
        parser.error("give --plans or --grid")
    if args.references is not None and args.references.exists():
        try:
            json.loads(args.references.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--references {args.references}: not a references file ({error})")
    elif args.references is not None and not args.references.parent.is_dir():
        parser.error(f"--references {args.references}: no folder {args.references.parent}")
    return args


def main() -> None:
    args = _arguments()
    from autotune import compose
    from autotune.records import Machine, parse_plan

    started = time.time()
    model = str(Path(args.model).resolve())
    # As every road predicts: the composition of a profile (the precisions it did not run
    # traced beside it), or with --road model-file of a trace alone (nothing run).
    record = compose.profile_model(model, batch_size=args.profile_batch, steps=2, warmup=1,
                                   device=args.device)  # fmt: skip
    stack = record.model.block_stack
    blocks = stack.count if stack else 1
    texts = [*args.plans, *(grid_plans(args.grid, blocks) if args.grid else [])]
    plans = [parse_plan(f"{text},nproc_per_node={args.nproc_per_node}") for text in texts]
    machine = Machine(device=args.device, nproc_per_node=args.nproc_per_node)
    composition = (
        compose.compose(record, machine=machine)
        if args.road == "profile"
        else compose.compose_facts(
            compose.model_file_facts(model, compose.TRACED_PRECISIONS, args.device),
            machine=machine,
        )
    )
    predicted = [composition.estimate(plan).memory.peak for plan in plans]
    with tempfile.TemporaryDirectory(prefix="zero-peaks-") as directory:
        work = Path(directory)
        none: list[int | None] = [None] * args.nproc_per_node
        trials = (
            [none] * len(plans)
            if args.no_trial
            else _trial_peaks(model, plans, work, args.nproc_per_node)
        )
        references = _reference_jobs(model, plans, args.nproc_per_node, work, args)
    parameters = record.model.parameters
    rows = []
    for plan, memory, trial, ranks in zip(plans, predicted, trials, references, strict=True):
        for rank, (live, measured) in enumerate(zip(trial, ranks, strict=True)):
            reference = measured["reference"] if measured else None
            low = measured.get("low", reference) if measured else None
            rows.append({
                "plan": plan.describe(), "rank": rank, "predicted": memory, "trial": live,
                "reference": reference, "low": low, "timeline": (measured or {}).get("timeline"),
                "at_peak": (measured or {}).get("at_peak", {}),
                "named": (measured or {}).get("named", []),
                "gloo": reference is not None and _gloo_mode(plan, memory, reference, parameters),
            })  # fmt: skip
    instrument = (
        "torch.cuda.max_memory_allocated"
        if args.device == "cuda"
        else ("bytes alive at the step's start + c10's allocation events replayed")
    )
    road = f"profile at micro-batch {args.profile_batch}" if args.road == "profile" else (
        "the model file's trace (nothing run)")  # fmt: skip
    print(f"model {Path(args.model).name}: {parameters:,} parameters; predicted from {road}; "
          f"{args.nproc_per_node} ranks; reference: {instrument}")  # fmt: skip
    errors = _print_table(rows, args.categories)
    _print_summary(rows, errors)
    _print_named(rows)
    print(f"{len(plans)} plans in {time.time() - started:.0f} s; command: {' '.join(sys.argv)}")


def _print_named(rows: list[dict[str, Any]], beyond: float = 0.05) -> None:
    """What was live at the peak of each rank row off by more than ``beyond``, by allocating op
    (``_zero_rank.named_at_peak``): where a miss comes from."""
    for row in rows:
        if row["reference"] is None or not row["named"]:
            continue
        error = bounded_error(row["predicted"], row["low"], row["reference"])
        if abs(error) > beyond:
            parts = "; ".join(f"{mib:.2f} {name}" for mib, name in row["named"])
            print(f"at the peak of {row['plan']} rank {row['rank']} ({100 * error:+.1f} %), "
                  f"MiB by allocating op: {parts}")  # fmt: skip


def _print_summary(rows: list[dict[str, Any]], errors: list[float]) -> None:
    missing = sum(row["reference"] is None for row in rows)
    if not errors:
        print(f"\nno rank row has a reference ({missing} rows: {NO_REFERENCE})")
        return
    line = summary(errors)
    worst = min(
        (r for r in rows if r["reference"]),
        key=lambda r: bounded_error(r["predicted"], r["low"], r["reference"]),
    )
    bounded = sum(r["reference"] is not None and r["low"] != r["reference"] for r in rows)
    gloo = sum(row["gloo"] for row in rows)
    under = (
        f"{100 * line['worst_under']:+.1f} % ({worst['plan']} rank {worst['rank']})"
        if line["worst_under"] < 0
        else "none"
    )
    print(f"\nunder-prediction: {round(line['under_share'] * line['rows'])} of {line['rows']} rank "
          f"rows ({100 * line['under_share']:.0f} %); |error| median {100 * line['median']:.1f} %, "
          f"p95 {100 * line['p95']:.1f} %, max {100 * line['max']:.1f} %; worst under-prediction "
          f"{under}; {gloo} rows in the gloo-partition mode; {bounded} rows bounded (a free on "
          f"another thread); {missing} rows with {NO_REFERENCE}")  # fmt: skip
    trackers = [
        bounded_error(r["trial"], r["low"], r["reference"])
        for r in rows
        if r["trial"] and r["reference"]
    ]
    if trackers:
        off = sum(abs(error) > 0.02 for error in trackers)
        print(f"trial tracker vs reference: {off} of {len(trackers)} rank rows off by more than "
              f"2 %, max {100 * max(trackers, key=abs):+.1f} %")  # fmt: skip


if __name__ == "__main__" and not rank_job(_zero_rank_main):
    main()
