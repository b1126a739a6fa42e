"""Does a small model's narrower calibration stack predict its step time as well as the widest,
and how much sooner is it measured? (issues 32, 33)

Usage: TORCH_EXTENSIONS_DIR=~/.cache/autotune-torch-extensions OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu \\
           .venv/bin/python bench/engine_width.py [--rounds 2] [--timeout 900]

1. On 2 ranks (torchrun, this file as the rank job): the link swept once, then the twelve engines
   of a 2-rank CPU search calibrated ``--rounds`` times at each width of
   :data:`autotune.estimator.WIDE_WIDTHS`, the widths alternating, each calibration timed.
2. Each kept step-time table of a model the narrower width serves (tiny GPT, tiny Llama, the zoo
   BERT): ``bench/step_time.py --print-only`` with each calibration's costs in place of the
   file's (its link, profile and measurements kept), its summary line; then the same with the
   file's own costs.
3. Each engine's cost per element a micro-batch at each width, the median of the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.estimator import wide_width

REPO = Path(__file__).resolve().parents[1]
GRID = "engines=zero0,zero2,zero3,fsdp2-3 precision=fp32,bf16 ckpt=none,full ga=1,4"
TABLES = (("examples/tiny_gpt.py", "step_time_tiny_gpt"),
          ("examples/tiny_llama.py", "step_time_tiny_llama"),
          ("bench/data/bert_s128.py", "step_time_bert"))  # fmt: skip
"""The kept step-time tables of models within the narrower width's two matrices."""
KEYS = [f"deepspeed-{stage}-{width}" for stage in range(4) for width in ("fp32", "bf16")] + [
    f"fsdp2-{stage}-{width}" for stage in (2, 3) for width in ("fp32", "bf16")]  # fmt: skip


def _ranks(out: Path, rounds: int) -> None:
    """The rank job: sweep the link, calibrate every engine at each width ``rounds`` times."""
    import torch.distributed as dist

    from autotune.estimator import WIDE_WIDTHS
    from autotune.runtime.link import trial_link
    from autotune.runtime.trial.engine_cost import measure
    from autotune.runtime.trial.lifeline import die_with_parent

    die_with_parent()  # with torchrun (zero_peaks._run_ranks)
    dist.init_process_group("gloo")
    link = None
    for _ in range(3):  # a noisy sweep of the fast loopback may not fit: sweep again
        link = link or trial_link()
    if link is None:
        raise SystemExit("autotune: the link's sweep did not fit three times")
    runs = []
    for index in range(rounds):
        for width in WIDE_WIDTHS:
            start = time.perf_counter()
            costs = measure(KEYS, link, width=width)
            runs.append({"round": index, "width": width, "seconds": time.perf_counter() - start,
                         "costs": [cost.model_dump(mode="json") for cost in costs]})  # fmt: skip
            if dist.get_rank() == 0:
                print(f"round {index + 1}, width {width}: {runs[-1]['seconds']:.1f} s", flush=True)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"gbps": link.gbps, "runs": runs}))
    dist.barrier()  # leave together: a group destroyed under a peer's gloo threads can abort
    dist.destroy_process_group()


def _summary(model: str, table: Path) -> str:
    """``bench/step_time.py --print-only``'s summary line for ``table``."""
    command = [sys.executable, "bench/step_time.py", model, "--nproc-per-node", "2",
               "--global-batch", "8", "--profile-batch", "1", "--rounds", "2",
               "--measurements", str(table), "--grid", GRID, "--print-only"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    lines = [line for line in done.stdout.splitlines() if "plans compared" in line]
    return lines[0].split("compared: ")[1] if lines else f"exit {done.returncode}, no summary"


def _with_costs(name: str, costs: list[dict[str, Any]], into: Path) -> Path:
    """A copy of the kept table ``name`` (and its profile) in ``into``, its link's engine costs
    ``costs``."""
    into.mkdir()
    kept = json.loads((REPO / "bench/data" / f"{name}.json").read_text())
    for entry in kept.values():
        entry["link"]["engine_costs"] = costs
    (into / f"{name}.json").write_text(json.dumps(kept))
    shutil.copy(REPO / "bench/data" / f"{name}.profile.json", into)
    return into / f"{name}.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds the rank job may take (default 900)")  # fmt: skip
    parser.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_job:
        _ranks(args.rank_job, args.rounds)
        return 0
    if args.rounds < 1:
        print(f"autotune: --rounds: must be >= 1 (got {args.rounds})", file=sys.stderr)
        return 2
    from zero_peaks import _run_ranks  # a rank job in a process group of its own, ended whole

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "costs.json"
        job = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", f"--log-dir={Path(tmp) / 'torchrun'}",
               str(Path(__file__).resolve()), "--rounds", str(args.rounds),
               "--rank-job", str(out)]  # fmt: skip
        print(f"calibrating {len(KEYS)} engines on 2 ranks, {args.rounds} round(s) of each width "
              f"(gives up after {args.timeout} s) ...", flush=True)  # fmt: skip
        if not _run_ranks(job, args.timeout, stdout=None) or not out.exists():
            return 1
        measured = json.loads(out.read_text())
        runs = measured["runs"]
        widths = sorted({run["width"] for run in runs})
        print(f"\nlink swept: {measured['gbps']:.3g} Gbit/s bus (gloo)")
        print("\n| width | calibration s, each round | median |\n|---|---|---|")
        for width in widths:
            seconds = [run["seconds"] for run in runs if run["width"] == width]
            print(f"| {width} | {', '.join(f'{s:.1f}' for s in seconds)} | "
                  f"{statistics.median(seconds):.1f} |")  # fmt: skip
        print(
            "\nkept step-time tables predicted with each calibration's costs "
            "(|error| median, p90, Spearman):"
        )
        for model, name in TABLES:
            profile = json.loads((REPO / "bench/data" / f"{name}.profile.json").read_text())
            parameters = profile["model"]["parameters"]
            print(
                f"\n{name}, {parameters:,} parameters, wide stack {wide_width(parameters)} wide "
                f"(with the file's costs: {_summary(model, REPO / 'bench/data' / f'{name}.json')})"
            )
            for index, run in enumerate(runs):
                table = _with_costs(name, run["costs"], Path(tmp) / f"{name}-{index}")
                print(f"  width {run['width']}, round {run['round'] + 1}: "
                      f"{_summary(model, table)}")  # fmt: skip
        print("\neach engine's cost per element a micro-batch, ns (median of the rounds):")
        print("| engine | " + " | ".join(f"width {w}" for w in widths) + " |")
        print("|---|" + "---|" * len(widths))
        for key in KEYS:
            cells = []
            for width in widths:
                values = [cost["micro_per_element_s"] * 1e9
                          for run in runs if run["width"] == width
                          for cost in run["costs"] if cost["engine"] == key]  # fmt: skip
                cells.append(f"{statistics.median(values):.2f}")
            print(f"| {key} | " + " | ".join(cells) + " |")
        print(f"\nload average {'/'.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
