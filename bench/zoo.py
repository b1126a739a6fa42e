"""The zoo: transformers' own model classes at tiny sizes (random init, no downloads), each
profiled and estimated from its config alone, against torch.profiler's memory timeline.

    .venv/bin/python bench/zoo.py [--device cuda] [NAME ...]

Per model (``examples/zoo/zoo.json``: config, family, tokens per sample, micro-batch):
its parameters; the measured peak (``autotune profile``'s: c10's CPU allocator over a plain step)
against torch.profiler's memory timeline of a hand-written step (``tests/_reference.py``) and
against the same profile's allocator figure (``Reference.allocator``); the live-tensor tracker's
own peak against the timeline, and torch's MemTracker (``tests/_memtracker.py``, a tensor
tracker under a dispatch mode too) against it; the pre-run estimate
(``autotune estimate --hf-config``: traced, nothing run at the micro-batch) against the
measured peak, with the trace path it took; and the profile and estimate wall times.
The micro-batch (4) is outside the trace's fit points (1 and 2). fp32, AdamW, CPU.

``--device cuda`` (``bench/gpu_check.py``'s zoo step): the profile runs on the GPU and the
reference is ``torch.cuda.max_memory_allocated`` around a hand-written step (torch.profiler's
and MemTracker's CPU columns are left out); the estimate is the same CPU trace.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "examples" / "zoo"
sys.path.insert(0, str(ROOT / "tests"))


@dataclass(frozen=True)
class Row:
    """One model's figures (bytes, seconds)."""

    name: str
    family: str
    parameters: int
    measured: int
    reference: int
    allocator: int
    live_tensors: int | None
    memtracker: int | None
    estimate: int
    path: str
    profile_s: float
    estimate_s: float

    @property
    def vs_reference(self) -> float:
        return self.measured / self.reference - 1

    @property
    def vs_allocator(self) -> float:
        return self.measured / self.allocator - 1

    @property
    def live_vs_reference(self) -> float | None:
        return self.live_tensors / self.reference - 1 if self.live_tensors else None

    @property
    def memtracker_vs_live(self) -> float | None:
        if not self.memtracker or not self.live_tensors:
            return None
        return self.memtracker / self.live_tensors - 1

    @property
    def vs_measured(self) -> float:
        return self.estimate / self.measured - 1


def zoo() -> dict[str, dict[str, object]]:
    """The zoo's index: name -> family, seq_len, batch."""
    return json.loads((ZOO / "zoo.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def measure(name: str, device: str = "cpu") -> Row:
    """Profile, reference and estimate one zoo model."""
    from _memtracker import memtracker_peak
    from _reference import reference_step

    from autotune.estimator import estimate_plan
    from autotune.records import Plan
    from autotune.runtime import hf
    from autotune.runtime.profiler import profile
    from autotune.runtime.trace import facts_from_hf_config

    entry = zoo()[name]
    config, seq_len, batch = ZOO / f"{name}.json", int(entry["seq_len"]), int(entry["batch"])  # type: ignore[call-overload]
    start = time.perf_counter()
    facts = facts_from_hf_config(config, seq_len, precisions=("fp32",))
    estimate = estimate_plan(facts, Plan(micro_batch=batch)).memory.peak
    estimate_s = time.perf_counter() - start
    with hf.model_source(None, hf_config=str(config), seq_len=seq_len) as source:
        start = time.perf_counter()
        record = profile(source.path, batch_size=batch, steps=1, warmup=1, device=device)
        profile_s = time.perf_counter() - start
        if device == "cuda":
            reference = allocator = cuda_reference(source.path, batch)
            tracker = None
        else:
            timeline = reference_step(source.path, batch)
            reference, allocator = timeline.peak, timeline.allocator
            tracker = memtracker_peak(source.path, batch)
    path = facts.activations["fp32"].path or "?"
    return Row(
        name, str(entry["family"]), facts.parameters, record.memory.peak, reference, allocator,
        record.memory.live_tensor_peak, tracker, int(estimate), path, profile_s, estimate_s,
    )  # fmt: skip


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


def _short_path(path: str) -> str:
    """The path's name without the reasons the paths before it failed (they follow in notes)."""
    return path.split(" (")[0]


def _percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:+.2f} %"


def table(rows: list[Row], reference: str = "torch.profiler") -> str:
    """The rows as a markdown table, then each fallback's reasons."""
    head = (
        f"| model | family | params | measured peak | {reference} | diff | allocator diff "
        "| live tensors diff | MemTracker vs live | estimate | diff | estimate path "
        "| profile s | estimate s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.family} | {r.parameters:,} | {r.measured / 2**20:.2f} MiB "
            f"| {r.reference / 2**20:.2f} MiB | {100 * r.vs_reference:+.2f} % "
            f"| {_percent(r.vs_allocator)} | {_percent(r.live_vs_reference)} "
            f"| {_percent(r.memtracker_vs_live)} "
            f"| {r.estimate / 2**20:.2f} MiB | {100 * r.vs_measured:+.2f} % "
            f"| {_short_path(r.path)} | {r.profile_s:.1f} | {r.estimate_s:.1f} |"
        )
    within2 = sum(abs(r.vs_reference) <= 0.02 for r in rows)
    live = [r.live_vs_reference for r in rows if r.live_vs_reference is not None]
    live2 = f"{sum(abs(x) <= 0.02 for x in live)}/{len(live)}"
    compared = [r.memtracker_vs_live for r in rows if r.memtracker_vs_live is not None]
    tracker2 = f"{sum(abs(x) <= 0.02 for x in compared)}/{len(compared)}"
    within5 = sum(abs(r.vs_measured) <= 0.05 for r in rows)
    lines.append("")
    lines.append(
        f"estimate succeeded: {len(rows)}/{len(rows)}; measured vs {reference} within 2 %: "
        f"{within2}/{len(rows)}; live tensors alone: {live2}; MemTracker vs live tensors "
        f"within 2 %: {tracker2}; estimate vs measured within 5 %: {within5}/{len(rows)}"
    )
    lines += [f"- {r.name}: {r.path}" for r in rows if "(" in r.path]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    import torch

    device = "cpu"
    if argv[:1] == ["--device"]:
        device, argv = argv[1], argv[2:]
    if device == "cpu":
        torch.set_num_threads(1)
    rows = []
    for name in argv or list(zoo()):
        rows.append(measure(name, device))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(table(rows, "torch.cuda max allocated" if device == "cuda" else "torch.profiler"))


if __name__ == "__main__":
    main(sys.argv[1:])
