"""The GPU check: every CUDA path of autotune on one NVIDIA GPU, and its figures, in under 8 minutes.

On a machine with one NVIDIA GPU it (1) runs ``pytest -m gpu``; (2) profiles a Llama of
about 1.1B parameters at sequence 2048 at two micro-batches, with and without checkpointing,
in bf16 autocast (``autotune profile``) and with DeepSpeed bf16 weights (autotune's trial
worker), and predicts each plan's peak from the model file alone (``autotune estimate``,
traced) and from one profile; (3) finds the largest micro-batch that fits for one plan with
``autotune tune``, a real out-of-memory included; (4) runs ZeRO-1/2/3 and FSDP2 stage 2/3
plans of a tiny Llama, one rank per GPU, against each rank's ``torch.cuda.max_memory_allocated``
(``bench/zero_peaks.py``, the grid of bench/RESULTS.md's CPU table); (5) writes every figure as markdown
(``--out``, default bench/RESULTS-gpu.md) and JSON beside it. It stops itself cleanly at
``--time-limit`` with what it has. ``--smoke`` runs the same steps on the CPU with a tiny
model (what tests/bench/test_gpu_check.py runs).

Run (GPU):   bash bench/gpu_check.sh [--time-limit 480] [--out FILE]
Run (CPU):   python bench/gpu_check.py --smoke --out /tmp/gpu-check/RESULTS-gpu.md
Paths (``--out``, ``--work-dir``) are read from the directory it is started in, any directory.
Exit status: 0 all ran and passed; 1 a check failed; 2 bad input; 3 stopped at the time limit;
130 / 143 stopped by SIGINT / SIGTERM (each writes what ran and kills every process it started).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import _gpu_check_report as report
import _gpu_check_steps as steps

from autotune.records import Terminated, sigterm_unwinds

REPO = Path(__file__).resolve().parents[1]
KEYS = [key for key, _, _ in steps.STEPS]


@dataclass(frozen=True, kw_only=True)
class Config:
    """The sizes of one run of the check: the GPU's, or the CPU smoke run's."""

    model: str
    """``GPU_CHECK_MODEL``: ``1b`` or ``tiny`` (bench/gpu_check_model.py)."""
    device: str
    micro_batches: tuple[int, ...]
    """Micro-batches profiled, each with no and with every block checkpointed."""
    profile_steps: int
    profile_warmup: int
    trial_steps: int
    trial_warmup: int
    tune_ladder: tuple[int, ...]
    """Micro-batches ``autotune tune`` runs, largest first; the first is the global batch."""
    trial_s: float
    """Expected seconds of one trial launch: tune keeps two for its final re-runs."""
    pytest_target: tuple[str, ...]
    time_limit: float
    min_seconds: dict[str, float]
    """Seconds a step (or one plan of it) needs: with fewer left it is not started."""
    sharded_grid: str
    """``bench/zero_peaks.py --grid`` of the sharded step (tiny Llama)."""
    sharded_nproc: int | None
    """Ranks of the sharded step; ``None``: one per visible GPU."""


GPU = Config(
    model="1b", device="cuda", micro_batches=(2, 8), profile_steps=5, profile_warmup=2,
    trial_steps=3, trial_warmup=1, tune_ladder=(32, 16, 8, 4), trial_s=30, pytest_target=("tests",),
    time_limit=480.0,
    min_seconds={"pytest": 60, "trace": 20, "profiles": 30, "estimate": 10, "tune": 90,
                 "deepspeed": 40, "zoo": 60, "sharded": 60},
    sharded_grid="engines=zero1,zero2,zero3,fsdp2-2,fsdp2-3 precision=fp32,bf16 "
                 "ckpt=none,partial,full ga=1,4 mb=2",
    sharded_nproc=None,
)  # fmt: skip
SMOKE = Config(
    model="tiny", device="cpu", micro_batches=(2,), profile_steps=2, profile_warmup=1,
    trial_steps=1, trial_warmup=0, tune_ladder=(2, 1), trial_s=20,
    pytest_target=("tests/runtime/test_gpu.py",), time_limit=300.0,
    min_seconds={"pytest": 10, "trace": 10, "profiles": 15, "estimate": 5, "tune": 40,
                 "deepspeed": 20, "zoo": 20, "sharded": 20},
    sharded_grid="engines=zero2 mb=2", sharded_nproc=1,
)  # fmt: skip


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny model (the test's run)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds of wall time (default 480; smoke 300)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown results (default bench/RESULTS-gpu.md; smoke: in --work-dir)")  # fmt: skip
    parser.add_argument("--only", default=None,
                        help=f"comma-separated steps to run (default all: {','.join(KEYS)})")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="profiles, estimates, the study and logs (default: beside --out)")  # fmt: skip
    return parser.parse_args(argv)


def _bad_input(args: argparse.Namespace, config: Config) -> str | None:
    """The one-line complaint about the options, if any (checked before any work)."""
    if args.time_limit is not None and args.time_limit <= 0:
        return f"--time-limit: must be positive (got {args.time_limit})"
    unknown = set(_only(args)) - set(KEYS)
    if unknown:
        return f"--only: unknown step {sorted(unknown)[0]!r} (known: {', '.join(KEYS)})"
    if not args.smoke:
        import torch

        if not torch.cuda.is_available():
            return (
                "no CUDA GPU is visible (torch.cuda.is_available() is False); use --smoke on a CPU"
            )
    return None


def _only(args: argparse.Namespace) -> list[str]:
    return [key.strip() for key in args.only.split(",") if key.strip()] if args.only else KEYS


def _run_steps(run: steps.Run, results: report.Results, out: Path, only: list[str]) -> None:
    """Each asked step that the time left allows; the results are rewritten after each."""
    for key, name, step in steps.STEPS:
        if key not in only:
            results.skipped.append(f"{name}: not asked for (--only)")
            continue
        if run.left() < run.config.min_seconds[key]:
            results.skipped.append(f"{name}: not run, {run.left():.0f} s left at the time limit")
            run.stopped = True
            continue
        print(f"gpu-check: {name} ({run.left():.0f} s left)", file=sys.stderr, flush=True)
        step(run, results)
        results.wall_s = run.elapsed()
        report.write(results, out)


def main(argv: list[str] | None = None) -> int:
    """Run every step the time allows, writing the results after each."""
    args = _arguments(argv)
    config = SMOKE if args.smoke else GPU
    problem = _bad_input(args, config)
    if problem is not None:
        print(f"autotune: {problem}", file=sys.stderr)
        return 2
    # The steps' commands run in the repository; paths the caller gave are from its directory.
    default = Path("gpu-check-smoke") if args.smoke else REPO / "bench"
    out = (args.out or default / "RESULTS-gpu.md").resolve()
    work = (args.work_dir or out.parent / "gpu-check-work").resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    limit = args.time_limit or config.time_limit
    run = steps.Run(config=config, work=work, repo=REPO, smoke=args.smoke,
                    deadline=time.monotonic() + limit)  # fmt: skip
    results = report.Results(
        command=" ".join([Path(sys.executable).name, *sys.argv]),
        environment=report.environment(config.device, REPO), time_limit=limit,
        device_memory=report.device_memory(config.device),
    )  # fmt: skip
    os.environ.update(run.child_env())
    code = 0
    try:
        with sigterm_unwinds():
            _run_steps(run, results, out, _only(args))
    except KeyboardInterrupt:
        code, results.signal = 130, "SIGINT"
    except Terminated as exc:
        code, results.signal = exc.exit_code, "SIGTERM"
    finally:  # trial workers run in their own sessions: a signal to the check alone misses them
        if results.signal is not None:
            results.skipped.append(f"stopped by {results.signal}: the step running then did "
                                   "not finish, and no later step ran")  # fmt: skip
        left = run.sweep()
        results.skipped += [f"process {pid} outlived its step: killed" for pid in left]
    results.stopped, results.wall_s = run.stopped, run.elapsed()
    report.write(results, out)
    print(report.summary(results, out))
    if code:
        return code
    if run.stopped:
        return 3
    return 1 if results.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
