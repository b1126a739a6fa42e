"""The zoo: transformers' own model classes at tiny sizes (random init, no downloads), each
profiled and estimated from its config alone, against torch.profiler's memory timeline.

    .venv/bin/python bench/zoo.py [--device cuda] [NAME ...]

Per model (``examples/zoo/zoo.json``: config, family, tokens per sample, micro-batch):
its parameters; the live-tensor tracker's peak (``memory.live_tensor_peak``, autotune's own
instrument) against torch.profiler's memory timeline of a hand-written step
(``tests/_reference.py``): the headline, two independent instruments; the pre-run estimate
(``autotune estimate --hf-config``: traced, nothing run at the micro-batch) against the
measured peak, with the trace path it took; torch's MemTracker (``tests/_memtracker.py``, a
tensor tracker under a dispatch mode too) against the live tensors; and the profile and
estimate wall times. The micro-batch (4) is outside the trace's fit points (1 and 2). fp32,
AdamW, CPU.

The measured peak (``autotune profile``'s ``memory.peak``: on the CPU c10's allocator over a
plain step, read from torch.profiler's memory events) is also set beside the timeline and the
same profile's allocator figure (``Reference.allocator``). Both sides of those two columns are
torch.profiler's events read two ways, so they check the reading, not the instrument.

A model whose profile, reference or estimate raises is kept as a row with the error, and the
success counts under the table count it: ``estimate succeeded: 16/17`` means one estimate
raised. The script still prints the table and exits 0 (``bench/gpu_check.py`` keeps it).

``--device cuda`` (``bench/gpu_check.py``'s zoo step): the profile runs on the GPU and the
reference is ``torch.cuda.max_memory_allocated`` around a hand-written step (torch.profiler's
and MemTracker's CPU columns are left out); the estimate is the same CPU trace.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from autotune.records import ProfileRecord

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "examples" / "zoo"
sys.path.insert(0, str(ROOT / "tests"))

T = TypeVar("T")

SAME_INSTRUMENT = {
    "cpu_allocator": "the profile's peak is c10's allocator read from torch.profiler's memory "
    "events, the timeline's own events",
    "cuda_max_allocated": "the profile's peak is torch.cuda.max_memory_allocated, the "
    "reference's own counter",
}
"""Why "measured vs reference" checks a reading, not an instrument, by the profile's peak source."""


@dataclass(frozen=True)
class Row:
    """One model's figures (bytes, seconds); ``None`` where a step failed or did not measure."""

    name: str
    family: str
    parameters: int | None
    measured: int | None
    peak_source: str | None
    reference: int | None
    allocator: int | None
    live_tensors: int | None
    memtracker: int | None
    estimate: int | None
    path: str | None
    profile_s: float | None
    estimate_s: float | None
    errors: tuple[str, ...] = ()

    @property
    def vs_reference(self) -> float | None:
        return _ratio(self.measured, self.reference)

    @property
    def vs_allocator(self) -> float | None:
        return _ratio(self.measured, self.allocator)

    @property
    def live_vs_reference(self) -> float | None:
        return _ratio(self.live_tensors, self.reference)

    @property
    def memtracker_vs_live(self) -> float | None:
        return _ratio(self.memtracker, self.live_tensors)

    @property
    def vs_measured(self) -> float | None:
        return _ratio(self.estimate, self.measured)


def _ratio(value: int | None, base: int | None) -> float | None:
    """``value / base - 1``, or ``None`` when either is missing (a failed step, not measured)."""
    return None if not value or not base else value / base - 1


def zoo() -> dict[str, dict[str, object]]:
    """The zoo's index: name -> family, seq_len, batch."""
    return json.loads((ZOO / "zoo.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _attempt(errors: list[str], step: str, call: Callable[[], T]) -> T | None:
    """``call()``, or ``None`` with ``"step: Error: message"`` appended to ``errors``."""
    try:
        return call()
    except Exception as error:  # a bench row records any failure and the zoo goes on
        errors.append(f"{step}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
        return None


def measure(name: str, device: str = "cpu") -> Row:
    """Profile, reference and estimate one zoo model; a step that raises is a row's error."""
    entry = zoo()[name]
    config, seq_len, batch = ZOO / f"{name}.json", int(entry["seq_len"]), int(entry["batch"])  # type: ignore[call-overload]
    errors: list[str] = []
    start = time.perf_counter()
    estimated = _attempt(errors, "estimate", lambda: _estimate(config, seq_len, batch, device))
    estimate_s = time.perf_counter() - start
    run = _attempt(errors, "model file", lambda: _run(config, seq_len, batch, device, errors))
    record, profile_s, reference = run or (None, None, None)
    memory = record.memory if record is not None else None
    parameters = estimated[0] if estimated else record.model.parameters if record else None
    return Row(
        name=name, family=str(entry["family"]), parameters=parameters,
        measured=memory.peak if memory else None,
        peak_source=memory.peak_source if memory else None,
        reference=reference[0] if reference else None,
        allocator=reference[1] if reference else None,
        live_tensors=memory.live_tensor_peak if memory else None,
        memtracker=reference[2] if reference else None,
        estimate=estimated[1] if estimated else None,
        path=estimated[2] if estimated else None,
        profile_s=profile_s, estimate_s=estimate_s if estimated else None,
        errors=tuple(errors),
    )  # fmt: skip


def _run(
    config: Path, seq_len: int, batch: int, device: str, errors: list[str]
) -> tuple[ProfileRecord | None, float | None, tuple[int, int, int | None] | None]:
    """The profile, its wall time and the reference, in the config's generated model file."""
    from autotune.runtime import hf
    from autotune.runtime.profiler import profile

    with hf.model_source(None, hf_config=str(config), seq_len=seq_len) as source:
        start = time.perf_counter()
        record = _attempt(
            errors,
            "profile",
            lambda: profile(source.path, batch_size=batch, steps=1, warmup=1, device=device),
        )
        profile_s = time.perf_counter() - start if record is not None else None
        reference = _attempt(errors, "reference", lambda: _reference(source.path, batch, device))
    return record, profile_s, reference


def _estimate(config: Path, seq_len: int, batch: int, device: str) -> tuple[int, int, str]:
    """Parameters, the estimated peak at ``batch`` from the config alone, on ``device`` (a
    GPU's cuBLAS workspace counted, as ``autotune estimate --hf-config`` counts it), and the
    trace path."""
    from autotune.compose import hf_config_facts
    from autotune.estimator import estimate_plan
    from autotune.records import Plan

    facts, _ = hf_config_facts(config, seq_len, ("fp32",), None, device)
    peak = estimate_plan(facts, Plan(micro_batch=batch)).memory.peak
    return facts.parameters, int(peak), facts.activations["fp32"].path or "?"


def _reference(path: Path, batch: int, device: str) -> tuple[int, int, int | None]:
    """The reference peak, the same profile's allocator figure, and MemTracker's peak."""
    if device == "cuda":
        peak = cuda_reference(path, batch)
        return peak, peak, None
    from _memtracker import memtracker_peak
    from _reference import reference_step

    timeline = reference_step(path, batch)
    return timeline.peak, timeline.allocator, memtracker_peak(path, batch)


def cuda_reference(path: Path, batch_size: int) -> int:
    """``torch.cuda.max_memory_allocated`` of the second of two hand-written AdamW steps."""
    import itertools

    import torch
    from _reference import load_module

    module = load_module(path)
    torch.manual_seed(0)
    model = module.build_model().cuda().train()
    optimizer = torch.optim.AdamW(model.parameters())
    batches = (module.build_batch(batch_size) for _ in itertools.count())

    def step() -> None:
        batch = {
            k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in next(batches).items()
        }
        loss = model(**batch).loss
        loss.backward()
        del loss, batch
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


def _short_path(path: str | None) -> str:
    """The path's name without the reasons the paths before it failed (they follow in notes)."""
    return "failed" if path is None else path.split(" (")[0]


def _percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:+.2f} %"


def _mib(value: int | None) -> str:
    return "failed" if value is None else f"{value / 2**20:.2f} MiB"


def _within(shares: list[float | None], bar: float) -> str:
    """``k/n``: of the ``n`` shares that were computed, ``k`` within ``bar``."""
    compared = [s for s in shares if s is not None]
    return f"{sum(abs(s) <= bar for s in compared)}/{len(compared)}"


def summary(rows: list[Row], reference: str = "torch.profiler") -> list[str]:
    """The lines under the table: what succeeded, then each comparison's count within its bar.

    Every count is ``k/n`` over the rows where both figures exist; a failed step lowers the
    success counts, so it cannot pass as agreement.
    """
    total = len(rows)
    profiled = sum(r.measured is not None for r in rows)
    referenced = sum(r.reference is not None for r in rows)
    estimated = sum(r.estimate is not None for r in rows)
    sources = {r.peak_source for r in rows if r.peak_source is not None}
    why = "; ".join(SAME_INSTRUMENT[s] for s in sorted(sources) if s in SAME_INSTRUMENT)
    same = f"same instrument: {why}" if why else "peak source " + ", ".join(sorted(sources))
    return [
        f"models: {total}; profile succeeded: {profiled}/{total}; reference succeeded: "
        f"{referenced}/{total}; estimate succeeded: {estimated}/{total}",
        f"live-tensor tracker vs {reference} within 2 % (independent instruments): "
        f"{_within([r.live_vs_reference for r in rows], 0.02)}",
        f"estimate vs measured within 5 %: {_within([r.vs_measured for r in rows], 0.05)}",
        f"MemTracker vs live tensors within 2 %: "
        f"{_within([r.memtracker_vs_live for r in rows], 0.02)}",
        f"measured vs {reference} within 2 % ({same}; a check of the reading, not of the "
        f"instrument): {_within([r.vs_reference for r in rows], 0.02)}",
    ]


def table(rows: list[Row], reference: str = "torch.profiler") -> str:
    """The rows as a markdown table, the summary, then each fallback's reasons and each error."""
    head = (
        f"| model | family | params | {reference} | live tensors | live vs {reference} "
        "| measured peak | estimate | estimate vs measured | estimate path "
        f"| MemTracker vs live | measured vs {reference} (same instrument) "
        "| measured vs allocator (same instrument) | profile s | estimate s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        params = "–" if r.parameters is None else f"{r.parameters:,}"
        seconds = ["–" if s is None else f"{s:.1f}" for s in (r.profile_s, r.estimate_s)]
        lines.append(
            f"| {r.name} | {r.family} | {params} | {_mib(r.reference)} "
            f"| {'–' if r.live_tensors is None else _mib(r.live_tensors)} "
            f"| {_percent(r.live_vs_reference)} | {_mib(r.measured)} | {_mib(r.estimate)} "
            f"| {_percent(r.vs_measured)} | {_short_path(r.path)} "
            f"| {_percent(r.memtracker_vs_live)} | {_percent(r.vs_reference)} "
            f"| {_percent(r.vs_allocator)} | {seconds[0]} | {seconds[1]} |"
        )
    lines.append("")
    lines += summary(rows, reference)
    lines += [f"- {r.name}: {r.path}" for r in rows if r.path and "(" in r.path]
    lines += [f"- {r.name} failed: {error}" for r in rows for error in r.errors]
    return "\n".join(lines)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("names", nargs="*", metavar="NAME", help="zoo models (default: all)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in zoo()]
    if unknown:
        parser.error(f"not in examples/zoo/zoo.json: {', '.join(unknown)}")
    return args


def main(argv: list[str]) -> None:
    import torch

    args = _arguments(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    rows = []
    for name in args.names or list(zoo()):
        rows.append(measure(name, args.device))
        state = "; ".join(rows[-1].errors) or "done"
        print(f"{name}: {state}", file=sys.stderr, flush=True)
    print(table(rows, "torch.cuda max allocated" if args.device == "cuda" else "torch.profiler"))


if __name__ == "__main__":
    main(sys.argv[1:])
