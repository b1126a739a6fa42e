"""The GPU check's figures and their markdown: the environment, pytest, the plans, the tune.

Everything printed comes from the records the check's steps read back from autotune
(profile JSON, estimate JSON, trial results, the study). ``None`` is "not measured" and
prints as an en dash.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from autotune.records import format_bytes

MARGIN = 0.10  # the estimate's default: fits = peak <= memory x (1 - margin)


class PlanKey(NamedTuple):
    """One plan of the check: precision, micro-batch, checkpointed blocks."""

    precision: str
    micro_batch: int
    checkpoint_blocks: int

    @classmethod
    def of(cls, plan: dict[str, Any]) -> PlanKey:
        return cls(plan["precision"], int(plan["micro_batch"]), int(plan["checkpoint_blocks"]))

    def knobs(self) -> str:
        return f"precision={self.precision},mb={self.micro_batch},ckpt={self.checkpoint_blocks}"

    def plan_fields(self) -> dict[str, Any]:
        return dict(self._asdict())

    def label(self) -> str:
        how = "autocast bf16" if self.precision == "amp_bf16" else "DeepSpeed bf16"
        return f"{how}, mb={self.micro_batch}, ckpt={self.checkpoint_blocks}"

    def slug(self) -> str:
        return f"{self.precision}-mb{self.micro_batch}-ckpt{self.checkpoint_blocks}"


@dataclass
class Measured:
    """One plan as measured: by ``autotune profile`` or by a trial."""

    how: str
    peak: int | None
    peak_source: str | None
    reserved: int | None
    step_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    gpu_util: float | None
    nvml_used: int | None
    flops_per_token: float | None = None
    peak_flops: float | None = None
    peak_flops_source: str | None = None
    bf16_fp32_ratio: float | None = None
    memory_bandwidth: float | None = None
    pcie_gbps: float | None = None
    note: str | None = None

    @classmethod
    def from_profile(cls, record: Any) -> Measured:
        memory, compute, env = record.memory, record.compute, record.environment
        tokens = record.config.batch_size * (record.model.tokens_per_sample or 0)
        per_token = compute.flops_per_step / tokens if compute.flops_per_step and tokens else None
        return cls(how="autotune profile", peak=memory.peak, peak_source=memory.peak_source,
                   reserved=memory.cuda_reserved, step_s=record.time.step,
                   tokens_per_s=record.throughput.tokens_per_s, mfu=compute.mfu,
                   gpu_util=env.nvml.gpu_utilization_percent if env.nvml else None,
                   nvml_used=env.nvml.memory_used_bytes if env.nvml else None,
                   flops_per_token=per_token, peak_flops=compute.peak_flops_per_s,
                   peak_flops_source=compute.peak_source,
                   bf16_fp32_ratio=env.capabilities.bf16_fp32_speed_ratio,
                   memory_bandwidth=env.memory_bandwidth_bytes_per_s, pcie_gbps=env.pcie_gbps,
                   note=env.unavailable.get("nvml"))  # fmt: skip

    @classmethod
    def from_trial(cls, result: Any, extra: dict[str, Any], per_token: float | None,
                   peak_flops: float | None) -> Measured:  # fmt: skip
        tokens = result.tokens_per_s
        mfu = tokens * per_token / peak_flops if tokens and per_token and peak_flops else None
        return cls(how="trial worker", peak=result.peak, peak_source=result.peak_source,
                   reserved=extra.get("reserved_bytes"), step_s=result.step_time,
                   tokens_per_s=tokens, mfu=mfu, gpu_util=extra.get("gpu_utilization_percent"),
                   nvml_used=extra.get("nvml_memory_used_bytes"), note=extra.get("nvml_reason"))  # fmt: skip


@dataclass
class PytestResult:
    command: str
    returncode: int | None
    summary: str
    seconds: float


@dataclass
class TuneRow:
    number: int
    role: str
    plan: str
    micro_batch: int
    state: str
    outcome: str | None
    peak: int | None
    peak_source: str | None
    predicted: int | None
    tokens_per_s: float | None
    reason: str | None


@dataclass
class TuneFigures:
    command: str
    budget: int
    seconds: float
    rows: list[TuneRow]
    recommendation: str | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    log_tail: str = ""

    def largest_fit(self) -> int | None:
        fits = [row.micro_batch for row in self.rows if row.outcome == "ok"]
        return max(fits) if fits else None

    def ooms(self) -> list[TuneRow]:
        return [row for row in self.rows if row.outcome == "oom"]


@dataclass
class Results:
    """Everything the check found, in the order it is printed."""

    command: str
    environment: dict[str, str]
    time_limit: float
    device_memory: int | None = None
    wall_s: float = 0.0
    stopped: bool = False
    signal: str | None = None
    """The signal that stopped the check before its steps were done (``SIGINT``, ``SIGTERM``)."""
    pytest: PytestResult | None = None
    commands: dict[str, str] = field(default_factory=dict)
    traced: dict[PlanKey, int] = field(default_factory=dict)
    profiled: dict[PlanKey, int] = field(default_factory=dict)
    step_seconds: dict[PlanKey, float] = field(default_factory=dict)
    """Seconds per step each plan is predicted at from the first profile (``autotune estimate``)."""
    measured: dict[PlanKey, Measured] = field(default_factory=dict)
    tune: TuneFigures | None = None
    zoo: str | None = None
    """``bench/zoo.py``'s table on this device, as it printed it."""
    sharded: str | None = None
    """``bench/zero_peaks.py``'s grid on this device, as it printed it."""
    skipped: list[str] = field(default_factory=list)
    errors: list[tuple[str, str, str]] = field(default_factory=list)

    def failures(self) -> list[str]:
        return [f"{step}: {what}" for step, what, _ in self.errors]


def device_memory(device: str) -> int:
    """Total memory of the GPU (NVML), or of the host on the CPU."""
    if device == "cuda":
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
    import psutil

    return int(psutil.virtual_memory().total)


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gpu(device: str) -> dict[str, str]:
    if device != "cuda":
        import torch

        from autotune.runtime._device import device_name

        return {"GPU": "none: CPU smoke run (tiny model)", "CPU": device_name(torch.device("cpu"))}
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        total = format_bytes(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        return {"GPU": f"{name}, {total}", "driver": str(pynvml.nvmlSystemGetDriverVersion())}
    except Exception as exc:  # NVML missing: the name still comes from torch
        import torch

        return {"GPU": torch.cuda.get_device_name(0), "driver": f"unknown (NVML: {exc})"}


def environment(device: str, repo: Path) -> dict[str, str]:
    """Date, GPU, driver and versions, read without starting CUDA in this process."""
    import torch

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=False).stdout.strip()  # fmt: skip

    commit = git("rev-parse", "--short", "HEAD")
    changed = len(git("status", "--porcelain", "--untracked-files=no").splitlines())
    if commit and changed:
        commit += f", with {changed} tracked files changed in the working tree"
    return {
        "date (UTC)": datetime.now(UTC).isoformat(timespec="seconds"),
        **_gpu(device),
        "torch / CUDA": f"{torch.__version__} / {torch.version.cuda or 'none'}",
        "DeepSpeed / transformers / optuna": " / ".join(
            _version(p) for p in ("deepspeed", "transformers", "optuna")
        ),
        "autotune": f"commit {commit or 'unknown'}",
    }


def _cell(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "bytes":
        return format_bytes(value)
    if kind == "pct":
        return f"{100 * value:.1f} %"
    if kind == "err":
        return f"{100 * value:+.1f} %"
    return f"{value:,.0f}" if kind == "int" else f"{value:.3g}"


def _plan_rows(results: Results) -> list[str]:
    head = ["plan", "measured by", "peak (source)", "reserved", "reserved − peak", "NVML used",
            "predicted: model file", "error", "predicted: profile", "error", "step (s)",
            "predicted step (s)", "error", "tokens/s", "MFU", "GPU util"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted(set(results.measured) | set(results.traced) | set(results.profiled))
    for key in keys:
        m = results.measured.get(key)
        peak = m.peak if m else None
        cells = [key.label(), m.how if m else "not measured"]
        cells.append(f"{_cell(peak, 'bytes')} ({m.peak_source})" if m and peak else "–")
        reserved = m.reserved if m else None
        cells += [
            _cell(reserved, "bytes"),
            _cell(reserved - peak if reserved and peak else None, "bytes"),
        ]
        cells.append(_cell(m.nvml_used if m else None, "bytes"))
        for predicted in (results.traced.get(key), results.profiled.get(key)):
            error = (predicted - peak) / peak if predicted and peak else None
            cells += [_cell(predicted, "bytes"), _cell(error, "err")]
        step, predicted_step = (m.step_s if m else None), results.step_seconds.get(key)
        step_error = (predicted_step - step) / step if step and predicted_step else None
        cells += [_cell(step), _cell(predicted_step), _cell(step_error, "err"),
                  _cell(m.tokens_per_s if m else None, "int"),
                  _cell(m.mfu if m else None, "pct"),
                  f"{m.gpu_util:.0f} %" if m and m.gpu_util is not None else "–"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _plans_section(results: Results) -> list[str]:
    lines = ["## 2. Plans: peak, reserved, predictions, time, MFU, utilisation", ""]
    for name, command in results.commands.items():
        lines.append(f"- {name}: `{command}`")
    lines += ["", *_plan_rows(results), ""]
    peaks = {m.peak_flops_source: m.peak_flops for m in results.measured.values() if m.peak_flops}
    for source, value in peaks.items():
        lines.append(f"MFU: model FLOPs (measured by the profile's FLOP counter) per second over "
                     f"the {source} peak, {value / 1e12:.3g} TFLOP/s (bf16).")  # fmt: skip
    lines += _links(results)
    beyond = [(m.nvml_used - m.peak) / results.device_memory for m in results.measured.values()
              if m.nvml_used and m.peak and results.device_memory]  # fmt: skip
    if beyond:
        lines.append(f"What tensors do not show (NVML's memory in use − the allocator's peak, the "
                     f"CUDA context included) was {100 * min(beyond):.1f}–{100 * max(beyond):.1f} % "
                     f"of the device's memory; the estimate's margin keeps {100 * MARGIN:.0f} % free.")  # fmt: skip
    return [*lines, ""]


def _links(results: Results) -> list[str]:
    """What the profile read of the device's links (NVML) and its bf16/fp32 matmul ratio."""
    profiled = [m for m in results.measured.values() if m.how == "autotune profile"]
    if not profiled:
        return []
    m = profiled[0]
    memory = f"{m.memory_bandwidth / 1e12:.3g} TB/s" if m.memory_bandwidth else "not read"
    pcie = f"{m.pcie_gbps:.4g} Gbit/s one way" if m.pcie_gbps else "not read"
    ratio = f"{m.bf16_fp32_ratio:.3g}" if m.bf16_fp32_ratio else "not measured"
    return [f"Read by the profile: memory bandwidth {memory}, PCIe link {pcie} (NVML); a bf16 "
            f"matmul ran x{ratio} the speed of an fp32 one (measured)."]  # fmt: skip


def _tune_section(tune: TuneFigures) -> list[str]:
    lines = ["## 3. `autotune tune`: the largest micro-batch that fits", "", f"`{tune.command}`", "",
             f"Budget given: {format_bytes(tune.budget)}, twice the device's memory, so the estimate "
             "prunes nothing and the device decides what fits. The ladder of micro-batches is "
             f"enqueued in the study first. {tune.seconds:.0f} s.", "",
             "| # | role | plan | state | outcome | measured peak | predicted peak | tokens/s | reason |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in tune.rows:
        lines.append(f"| {row.number} | {row.role} | {row.plan} | {row.state} | {row.outcome or '–'} | "
                     f"{_cell(row.peak, 'bytes')} | {_cell(row.predicted, 'bytes')} | "
                     f"{_cell(row.tokens_per_s, 'int')} | {row.reason or ''} |")  # fmt: skip
    ooms = tune.ooms()
    after = [r for r in tune.rows if ooms and r.number > ooms[0].number and r.outcome]
    lines += ["", f"- Largest micro-batch that fits: {tune.largest_fit() or '–'} (outcome ok).",
              "- Out of memory: " + (", ".join(f"micro-batch {r.micro_batch} (trial {r.number})"
                                              for r in ooms) or "none") + ".",  # fmt: skip
              f"- Trials measured after the first out-of-memory: {len(after)}.",
              f"- Recommendation: {tune.recommendation or '–'}."]  # fmt: skip
    lines += [f"- tune's note: {note}" for note in tune.notes]
    return [*lines, ""]


def _status(results: Results) -> str:
    if results.signal is not None:
        return f"stopped by {results.signal}"
    return "stopped at the time limit" if results.stopped else "complete"


def markdown(results: Results) -> str:
    """The whole results page."""
    status = _status(results)
    lines = ["# GPU check", "",
             "Written by `bench/gpu_check.py`; every figure below is what that run measured "
             "(timings from one run each, not repeats).", "", "| | |", "|---|---|",
             f"| command | `{results.command}` |"]  # fmt: skip
    lines += [f"| {key} | {value} |" for key, value in results.environment.items()]
    lines += [
        f"| wall time | {results.wall_s:.0f} s of the {results.time_limit:.0f} s limit, {status} |",
        "",
    ]
    if results.pytest is not None:
        p = results.pytest
        lines += [
            "## 1. `pytest -m gpu`",
            "",
            f"`{p.command}`: **{p.summary}** ({p.seconds:.0f} s)",
            "",
        ]
    if results.measured or results.traced or results.profiled:
        lines += _plans_section(results)
    if results.tune is not None:
        lines += _tune_section(results.tune)
    if results.zoo is not None:
        lines += [f"## Zoo: `{results.commands.get('zoo', 'bench/zoo.py')}`", "", results.zoo, ""]
    if results.sharded is not None:
        command = results.commands.get("sharded", "bench/zero_peaks.py")
        lines += [f"## Sharded per-rank peaks: `{command}`", "", results.sharded, ""]
    if results.skipped or results.errors:
        lines += ["## Not run, or failed", ""]
        lines += [f"- {item}" for item in results.skipped]
        for step, what, tail in results.errors:
            lines.append(f"- **{step}**: {what}")
            if tail:
                lines += ["", "  ```", *("  " + line for line in tail.splitlines()), "  ```"]
        lines.append("")
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {(k.slug() if isinstance(k, PlanKey) else k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def write(results: Results, out: Path) -> None:
    """The markdown at ``out`` and the same figures as JSON beside it (``.json``)."""
    out.write_text(markdown(results), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(_jsonable(results), indent=1), encoding="utf-8")


def summary(results: Results, out: Path) -> str:
    """The check's last line."""
    status = _status(results)
    failures = results.failures()
    told = f"{len(failures)} failed: " + "; ".join(failures) if failures else "nothing failed"
    return f"gpu-check: {status} in {results.wall_s:.0f} s; {told}; wrote {out}"
