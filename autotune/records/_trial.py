"""The trial protocol: what the search and the trial processes it launches share (the
worker's spec and result, the environment names, the files of a pooled group, the entry points).
Both sides import it from here, so the runtime never imports the search."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from autotune.records._base import Record as _Record
from autotune.records._link import LinkMeasure
from autotune.records._options import TRIAL_TIMEOUT_S
from autotune.records._plan import Plan
from autotune.records._profile import ProfileRecord

LIFELINE_ENV = "AUTOTUNE_PARENT_PID"
"""Names the process whose death ends a guarded launch (``EntryPoints.lifeline``)."""
EXTENSIONS_DIR = Path("~/.cache/autotune-torch-extensions").expanduser()
"""Where launches build torch extensions (``TORCH_EXTENSIONS_DIR`` unless set)."""
GUARD_EXIT = 87
"""The exit status of a trial worker stopped by its memory guard. torchrun reports it per rank
("exitcode : 87") after a traceback long enough to push the guard's own line out of the tail."""
SCRIPT_SPEC_ENV = "AUTOTUNE_SCRIPT_SPEC"
"""Names the trial spec in the launched processes (the hook acts only where it is set)."""
PROBE_ENV = "AUTOTUNE_SCRIPT_PROBE"
"""Where a probe launch writes its :class:`ScriptProbe`."""
PROFILE_ENV = "AUTOTUNE_SCRIPT_PROFILE"
"""Where a probe launch writes the profile of the script's model and first batch."""


class TrialSettings(_Record):
    """What every trial of one study shares: the model, the step counts, the budget."""

    model_file: str
    steps: int = Field(default=3, ge=1, description="measured optimizer steps")
    warmup: int = Field(default=1, ge=0, description="optimizer steps run first and dropped")
    device: str = Field(default="auto", description="auto, cpu or cuda")
    device_memory: int | None = Field(default=None, description="budget per device in bytes")
    memory_guard: int | None = Field(
        None, description="RSS per rank above which the worker stops itself (protects the machine)"
    )
    timeout_s: float = Field(default=TRIAL_TIMEOUT_S, gt=0, description="hard limit per launch")
    seed: int = 0
    interval_width: float | None = Field(
        default=None,
        gt=0,
        description="keep measuring until the median step time's interval is within this "
        "relative half-width (0.05: +-5 %); None: exactly `steps` steps",
    )
    max_steps: int = Field(default=20, ge=1, description="cap on measured steps (with a width)")
    max_measure_s: float = Field(
        default=15.0, gt=0, description="cap on seconds of measured steps (with a width)"
    )
    stop_slower_than_s: float | None = Field(
        default=None,
        gt=0,
        description="stop measuring (after `steps`, before the width or the caps) once the "
        "median step time's interval lies wholly above this many seconds: the plan is slower "
        "than the best measured, and more steps would only say by how much; None: no such stop",
    )
    measure_peak: bool = Field(
        default=True,
        description="measure each rank's peak on a CPU (where: peak_step; False: a re-run of a "
        "plan whose peak an earlier run measured); on a GPU the allocator's peak of the timed "
        "steps is read and no step more is run",
    )
    peak_step: Literal["warmup", "extra"] = Field(
        default="warmup",
        description="where a CPU trial of DeepSpeed ZeRO-0/1/2 or FSDP2 measures the peak: "
        "warmup, the first warm-up step under the live-tensor tracker, the storages it kept to "
        "its end (lazily made optimizer states, gradient buffers) counted from its start as in "
        "every later step (no step more; with --warmup 0, extra); extra, one more untimed step "
        "after the timed ones, as ZeRO-3 (whose first step prefetches nothing), one-rank "
        "plain-torch and script trials always take",
    )
    sweep_link: bool = Field(
        default=True,
        description="sweep the link between the ranks after the steps (False: the study has a "
        "link already, or the run is a comparison's)",
    )
    engine_costs: list[str] = Field(
        default_factory=list,
        description="engines whose own per-step cost the sweep also measures "
        "(autotune.estimator.engine_key); only with sweep_link",
    )
    known_link: LinkMeasure | None = Field(
        default=None,
        description="a link swept before, which the time model predicts with: with sweep_link, "
        "the engines' own costs are measured against it, and no new sweep is made (a bench's "
        "link, kept with its measurements)",
    )


class WorkerSpec(_Record):
    """The file a trial worker reads: the settings, the plan, where to write the result."""

    settings: TrialSettings
    plan: Plan
    result_path: str
    warmup_only: bool = Field(
        default=False, description="only pay launcher start-up (comm-op compile)"
    )


class StepSplit(_Record):
    """Median seconds per optimizer step, by phase (plain-torch trials only)."""

    dataloader: float
    forward: float
    backward: float
    optimizer: float


class TrialResult(_Record):
    """What rank 0 of a trial writes; ``None`` means not measured."""

    completed_steps: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time: float | None = Field(default=None, description="median seconds per optimizer step")
    step_times: list[float] = Field(default_factory=list)
    step_interval: tuple[float, float] | None = Field(
        default=None, description="the median step time's interval (order statistics, >= 90 %)"
    )
    split: StepSplit | None = None
    peak_memory_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: the peak a budget check and the estimate use",
    )
    peak_source: str | None = Field(
        default=None,
        description="cuda_max_allocated; on CPU cpu_allocator (a plain torch trial, as "
        "`autotune profile` measures) or cpu_live_tensors (DeepSpeed, FSDP2); or cpu_rss_delta "
        "where neither could be measured",
    )
    live_tensor_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: the peak by peak_source's CPU measure, of the step "
        "settings.peak_step names (empty: not measured, as on a GPU, whose allocator gives "
        "the peak)",
    )
    rss_delta_bytes: list[int] = Field(
        default_factory=list,
        description="one per rank: process RSS growth since the model file loaded; "
        "includes allocator caches and library memory, so larger than the peak",
    )
    device_memory: int | None = Field(
        default=None, description="the budget the peak is judged against"
    )
    loss_first: float | None = None
    loss_last: float | None = None
    engine: Literal["torch", "deepspeed", "fsdp2", "none"] = "torch"
    link: LinkMeasure | None = Field(
        default=None,
        description="the link between the trial's ranks, swept after its steps (a short "
        "all-reduce / all-gather / reduce-scatter sweep); None: one rank",
    )
    error: str | None = Field(
        default=None, description="exception type and message, if the step raised"
    )
    first_step_at: float | None = Field(
        default=None, description="wall clock (time.time) when the first step began"
    )
    steps_s: float | None = Field(
        default=None, description="seconds of all steps run (warm-up and measured)"
    )
    reused: bool = Field(
        default=False, description="whether the worker process had run a trial before this one"
    )

    @property
    def peak(self) -> int | None:
        """The largest per-rank peak, the figure a budget check uses."""
        return max(self.peak_memory_bytes) if self.peak_memory_bytes else None


class ScriptProbe(_Record):
    """What one probe launch learns of the script's model before any trial."""

    blocks: int = 0
    block_stack: str | None = None
    parameters: int | None = None
    entry: str | None = Field(
        default=None,
        description="the entry point that took the plan: trainer, deepspeed, accelerate",
    )
    profile_error: str | None = Field(default=None, description="why there is no profile")
    profile: ProfileRecord | None = Field(
        default=None, description="the model and first batch profiled (None: not asked, or failed)"
    )


@dataclass(frozen=True, kw_only=True)
class EntryPoints:
    """The processes a launch starts. The search launches them but never names them: they
    live in a layer above it, and the composer passes that layer's ``ENTRY_POINTS`` in
    (a test or bench may pass its own worker)."""

    worker: str
    """Module (or ``.py`` path) that runs one trial from a :class:`WorkerSpec` file."""
    server: str
    """Module (or ``.py`` path) of a pooled worker group that runs trials on request."""
    lifeline: str
    """Module that guards a launch (it dies with ``LIFELINE_ENV``'s process), then execs it."""

    @staticmethod
    def target(name: str) -> list[str]:
        """How ``python`` starts ``name``: a ``.py`` path as a script, else ``-m`` module."""
        return [name] if name.endswith(".py") else ["-m", name]


def request_path(folder: Path, index: int) -> Path:
    """Where the parent puts a group's ``index``-th request (a :class:`WorkerSpec`)."""
    return folder / f"request-{index}.json"


def done_path(folder: Path, index: int) -> Path:
    """The marker rank 0 writes once the ``index``-th result file is final."""
    return folder / f"done-{index}"


def stop_path(folder: Path) -> Path:
    """The file that tells every rank of a group to exit."""
    return folder / "stop"


__all__ = [
    "EXTENSIONS_DIR",
    "GUARD_EXIT",
    "LIFELINE_ENV",
    "PROBE_ENV",
    "PROFILE_ENV",
    "SCRIPT_SPEC_ENV",
    "EntryPoints",
    "ScriptProbe",
    "StepSplit",
    "TrialResult",
    "TrialSettings",
    "WorkerSpec",
    "done_path",
    "request_path",
    "stop_path",
]
