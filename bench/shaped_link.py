"""Shaped-link communication per step, predicted against measured, at several bandwidths (issue 32).

Plans: ZeRO-2, ZeRO-3 (DeepSpeed) and FSDP2 stage 3, each with and without accumulation.

Usage (root, iproute2's ip and tc): .venv/bin/python bench/shaped_link.py \\
           [--rates 200mbit,1gbit,5gbit] [--rounds 6] [--out FILE]

The method of ``tests/runtime/test_shaped_link.py`` (shared code: ``tests/_link_job.py``,
``tests/_link_rank.py``) at each rate: in a network namespace made for the run, two torchrun
"nodes" of one rank each talk over its loopback (127.0.0.1), which ``tc`` tbf shapes to the rate.
One job per rate sweeps the link shaped and open, then times each plan in windows that alternate
shaped and open, then sweeps it shaped again. Measured communication: the median, over the window
pairs, of (shaped - open) seconds per step. Predicted: ``collective_seconds(step_calls(plan))``,
the mean over the two shaped sweeps, less the same on the open sweep. The collectives each plan issued are counted and set against
``step_calls``; a disagreement is printed, not forced. The namespace is deleted at the end, also
on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from step_time import _Parser, _provenance, _refuse
from zero_peaks import REPO

sys.path.insert(0, str(REPO / "tests"))  # the shaped-link job lives with its CI test
from _link_job import (  # noqa: E402
    RDZV_PORT,
    LinkJobError,
    link_namespace,
    namespace_problem,
    run_job,
    shaped_sweeps,
)

from autotune.estimator import Calls, collective_seconds, plan_link, step_calls  # noqa: E402
from autotune.records import LinkMeasure, Machine, Plan, parse_plan  # noqa: E402

PLANS = {
    "zero2_ga1": "stage=2,mb=4,ga=1",
    "zero2_ga2": "stage=2,mb=4,ga=2",
    "zero3_ga1": "stage=3,mb=4,ga=1",
    "zero3_ga2": "stage=3,mb=4,ga=2",
    "fsdp2_3_ga1": "engine=fsdp2,stage=3,mb=4,ga=1",
    "fsdp2_3_ga2": "engine=fsdp2,stage=3,mb=4,ga=2",
}
WIDTH_BYTES = 4
"""Bytes per element communicated: every plan here trains in fp32."""
RATE = re.compile(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)")
UNIT_BPS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
MIN_BPS, MAX_BPS = 50e6, 40e9
HEAVIEST_STEP_BITS = 8 * 32e6
"""Bits through the shaped queue in one step of the heaviest plan, with margin (FSDP2-3 at ga=2
sends about 12.6 MB of bus bytes each way: ~25 MB through lo's one queue): sizes the deadline."""
SWEEP_TRIES = 3
"""Sweeps of each kind before the job fails: the open loopback's fit can refuse its points
(times that do not grow with size under noise); each refusal is printed."""
WINDOW_STEPS = 2  # _link_rank.STEPS (the rank imports torch; the bench does not)
COLLECTIVE_NAMES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
                    "all_gather_single": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
                    "reduce_scatter_single": "reduce_scatter"}  # fmt: skip


HEADER = f"{'plan':<12} {'knobs':<31} {'predicted s':>11} {'measured s (min–max)':>27} {'error':>9}"
Counts = tuple[float, float, int, int]


@dataclass(frozen=True)
class Row:
    """One plan at one rate: communication seconds per step, predicted and measured."""

    rate: str
    name: str
    predicted: float
    measured: float
    low: float
    high: float

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; ``None`` where the shaping added no time."""
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else None


def rate_bps(text: str) -> float:
    """Bits per second of a tc rate (``200mbit``, ``1gbit``); ``ValueError`` naming what is wrong."""
    match = RATE.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r}: give a tc rate such as 200mbit or 1gbit")
    bps = float(match[1]) * UNIT_BPS[match[2]]
    if not MIN_BPS <= bps <= MAX_BPS:
        raise ValueError(f"{text!r}: keep rates within 50mbit..40gbit")
    return bps


def _arguments() -> argparse.Namespace:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200mbit,1gbit,5gbit", help="tc rates, comma-separated")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=6, help="shaped/open window pairs per plan")  # fmt: skip
    parser.add_argument("--out", type=Path, help="keep the jobs' raw JSON here")
    args = parser.parse_args()
    rates = [r.strip().lower() for r in args.rates.split(",") if r.strip()]
    if not rates:
        _refuse("--rates: give at least one rate, e.g. --rates 1gbit")
    for rate in rates:
        try:
            rate_bps(rate)
        except ValueError as error:
            _refuse(f"--rates: {error}")
    if len(set(rates)) != len(rates):
        _refuse(f"--rates: a rate given twice ({args.rates})")
    args.rates = rates
    if args.rounds < 1:
        _refuse(f"--rounds: must be >= 1 (got {args.rounds})")
    if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
        _refuse(f"--out {args.out}: give a file in an existing folder")
    return args


def job_deadline_s(bps: float, rounds: int, plans: int) -> float:
    """Seconds the 2-node job may take: start-up, rendezvous and sweeps, then every plan's
    warm-up and window pairs at the heaviest plan's step through the shaped queue."""
    return 240 + plans * (rounds + 2) * (5 + 2 * WINDOW_STEPS * HEAVIEST_STEP_BITS / bps)


def _plan(knobs: str) -> Plan:
    return parse_plan(f"{knobs},nproc_per_node=1,nnodes=2")


def _seconds(calls: list[Calls], plan: Plan, sweep: LinkMeasure) -> float:
    link = plan_link(Machine(link=sweep), plan)
    assert link is not None
    return collective_seconds(calls, plan.world_size, WIDTH_BYTES, link)


def _calls(plan: Plan, results: dict[str, Any]) -> list[Calls]:
    """``step_calls`` of ``plan`` on the job's model (its FSDP2 units: a file from before they
    were written has none)."""
    return step_calls(plan, results["parameters"], results["parameter_sizes"],
                      blocks=results.get("blocks", 0),
                      block_parameters=results.get("block_parameters"))  # fmt: skip


def rows_of(rate: str, results: dict[str, Any]) -> list[Row]:
    """Predicted and measured communication per step of each plan the job ran at ``rate``."""
    sweeps = shaped_sweeps(results)
    opened = LinkMeasure.model_validate(results["sweep_open"])
    rows = []
    for name, run in results["plans"].items():
        plan = _plan(run["knobs"])
        calls = _calls(plan, results)
        extra = [s - o for s, o in zip(run["shaped"], run["open"], strict=True)]
        shaped = statistics.mean(_seconds(calls, plan, sweep) for sweep in sweeps)
        rows.append(Row(rate, name, shaped - _seconds(calls, plan, opened),
                        statistics.median(extra), min(extra), max(extra)))  # fmt: skip
    return rows


def collectives_check(results: dict[str, Any]) -> dict[str, dict[str, Counts]]:
    """Per plan and collective: (bytes counted, bytes modelled, calls counted, calls modelled)
    per step; collectives of 64 bytes or less in all left out as the test does (DeepSpeed's
    flag all-reduces)."""
    checked: dict[str, dict[str, Counts]] = {}
    for name, run in results["plans"].items():
        calls = _calls(_plan(run["knobs"]), results)
        counted: dict[str, tuple[float, int]] = {}
        for raw, (count, nbytes) in run["calls"].items():
            if raw in COLLECTIVE_NAMES and nbytes > 64:
                so_far = counted.get(COLLECTIVE_NAMES[raw], (0.0, 0))
                counted[COLLECTIVE_NAMES[raw]] = (so_far[0] + nbytes, so_far[1] + count)
        checked[name] = {}
        for collective in sorted({c.collective for c in calls if c.elements > 0} | set(counted)):
            mine = [c for c in calls if c.collective == collective and c.elements > 0]
            nbytes, count = counted.get(collective, (0.0, 0))
            checked[name][collective] = (nbytes, WIDTH_BYTES * sum(c.elements for c in mine),
                                         count, sum(c.count for c in mine))  # fmt: skip
    return checked


def _sweep_line(sweep: LinkMeasure) -> str:
    fits = ", ".join(f"{c} {f.bandwidth_bytes_per_s * 8e-9:.3g}" for c, f in sweep.collectives.items())  # fmt: skip
    return f"{sweep.gbps:.3g} Gbit/s bus ({fits}), {sweep.latency_s * 1e6:.0f} us"


def _percent(error: float | None) -> str:
    return "–" if error is None else f"{100 * error:+.1f} %"


def print_rate(rate: str, results: dict[str, Any], rows: list[Row]) -> None:
    """The rate's sweeps, its table, and how the plans rank, predicted and measured."""
    shaped = "; after the windows ".join(_sweep_line(sweep) for sweep in shaped_sweeps(results))
    opened = LinkMeasure.model_validate(results["sweep_open"])
    print(f"\n== tbf {rate}: shaped sweep {shaped}; open {_sweep_line(opened)}")
    for kind, errors in results.get("sweep_failures", {}).items():
        for error in errors:
            print(f"the {kind} sweep's fit refused its points, swept again: {error}")
    print(HEADER)
    for row in rows:
        knobs = results["plans"][row.name]["knobs"]
        spread = f"{row.measured:.4f} ({row.low:.4f}–{row.high:.4f})"
        print(f"{row.name:<12} {knobs:<31} {row.predicted:>11.4f} {spread:>27} {_percent(row.error):>9}")  # fmt: skip
    by = {row.name: row for row in rows}
    verdicts = []
    for ga in (1, 2):
        two, three = by.get(f"zero2_ga{ga}"), by.get(f"zero3_ga{ga}")
        if two and three:
            predicted, measured = three.predicted > two.predicted, three.measured > two.measured
            agree = "both say so" if predicted and measured else (
                "neither" if not (predicted or measured) else "DISAGREE")  # fmt: skip
            verdicts.append(f"ga={ga}: predicted {'yes' if predicted else 'no'}, measured "
                            f"{'yes' if measured else 'no'} ({agree})")  # fmt: skip
    print(f"ZeRO-3 slower than ZeRO-2? {'; '.join(verdicts)}")
    for key in ("predicted", "measured"):
        order = sorted(rows, key=lambda r: float(getattr(r, key)))
        print(f"order by {key} (least first): {' < '.join(r.name for r in order)}")


def print_checks(checks: dict[str, dict[str, dict[str, Counts]]]) -> None:
    """Collectives counted against ``step_calls``, per plan (the first rate's; any other rate
    that differs is named)."""
    first = next(iter(checks.values()))
    print("\ncollectives per step, counted vs step_calls (MB counted/modelled, calls counted/modelled):")  # fmt: skip
    for name, per in first.items():
        cells = []
        for collective, (counted, modelled, n_counted, n_modelled) in per.items():
            off = abs(counted - modelled) > 0.01 * max(modelled, 1.0)
            cells.append(f"{collective} {counted / 1e6:.3f}/{modelled / 1e6:.3f}"
                         f"{' BYTES DIFFER' if off else ''} ({n_counted}/{n_modelled})")  # fmt: skip
        print(f"  {name:<12} {'; '.join(cells)}")
    print("  (all_reduce calls counted include DeepSpeed's flag all-reduces and the window's own "
          "timing all-reduce)")  # fmt: skip
    for rate, per_plan in checks.items():
        if per_plan != first:
            print(f"  (the counts at {rate} differ from the first rate's: {per_plan})")


def print_summary(rows: list[Row], sweeps: dict[str, list[LinkMeasure]]) -> None:
    """|error| median and p90 over every row, and each rate's shaped sweeps."""
    size = sorted(abs(r.error) for r in rows if r.error is not None)
    left_out = len(rows) - len(size)
    if size:
        p90 = size[min(len(size) - 1, round(0.9 * (len(size) - 1)))]
        print(f"\n{len(size)} rows: |error| median {100 * statistics.median(size):.1f} %, "
              f"p90 {100 * p90:.1f} %" + (f" ({left_out} rows with no measured time left out)"
                                          if left_out else ""))  # fmt: skip
    fitted = (
        f"tbf {rate} -> {' then '.join(f'{s.gbps:.3g}' for s in each)} Gbit/s bus"
        for rate, each in sweeps.items()
    )
    print("shaped sweeps fitted (before, after the windows): " + "; ".join(fitted))


def _stop(signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds: the jobs killed, the namespace deleted


def main() -> None:
    args = _arguments()
    problem = namespace_problem()
    if problem is not None:
        _refuse(f"a shaped link cannot be made here: {problem}")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    started = time.monotonic()
    raw: dict[str, Any] = {"command": " ".join(sys.argv), "rounds": args.rounds, "rates": {}}
    rows: list[Row] = []
    checks: dict[str, dict[str, dict[str, Counts]]] = {}
    sweeps: dict[str, list[LinkMeasure]] = {}
    try:
        with link_namespace() as namespace, tempfile.TemporaryDirectory(prefix="autotune-link-") as tmp:  # fmt: skip
            for index, rate in enumerate(args.rates):
                deadline = job_deadline_s(rate_bps(rate), args.rounds, len(PLANS))
                print(f"tbf {rate}: 2-node job in {namespace}, {len(PLANS)} plans x "
                      f"{args.rounds} window pairs, deadline {deadline:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
                results = run_job(namespace, Path(tmp) / f"{rate}.json", rate, PLANS,
                                  timeout_s=deadline, port=RDZV_PORT + index, rounds=args.rounds,
                                  sweep_tries=SWEEP_TRIES)  # fmt: skip
                raw["rates"][rate] = results
                if args.out is not None:
                    args.out.write_text(json.dumps(raw), encoding="utf-8")
                rows += rows_of(rate, results)
                checks[rate] = collectives_check(results)
                sweeps[rate] = shaped_sweeps(results)
                print_rate(rate, results, [r for r in rows if r.rate == rate])
                sys.stdout.flush()
    except LinkJobError as error:
        print(f"autotune: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted: the jobs killed, the namespace deleted", file=sys.stderr)
        sys.exit(130)
    print_checks(checks)
    print_summary(rows, sweeps)
    print(f"{time.monotonic() - started:.0f} s")
    print(f"command: {' '.join(sys.argv)}")
    print(_provenance())


if __name__ == "__main__":
    main()
