"""What a run is asked: every option of ``autotune profile``, ``autotune confirm`` and
``autotune tune`` (bar the machine's, the model's and where the output goes), each declared
here once, with its default and its checks. The CLI's flags read their defaults from here."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.records._errors import AutotuneError, named
from autotune.records._machine import Machine
from autotune.records._plan import Plan

TRIAL_TIMEOUT_S = 300.0
"""Seconds before a trial's process group is killed, wherever a timeout is not given."""
HEARTBEAT_S = 10
"""Seconds between a running trial's heartbeats; three missed and it is lost."""
JOIN_TIMEOUT_S = 120.0
"""Seconds the nodes of a trial wait for each other at the rendezvous."""
FRONT_SIZE = 4
"""Plans of the predicted front queued after the policy's plan and the baseline."""
ENGINES = ("deepspeed", "fsdp2")
"""Who may shard a ZeRO stage; a model file's tune searches both by default (``--engines``)."""
SCRIPT_ENGINES = ("deepspeed",)
"""What a script's trials can inject: DeepSpeed only (no FSDP2 plugin for Trainer or
Accelerate scripts), a script's tune's default."""
AUTOCASTS = ("off", "bf16", "fp16")
"""``--autocast`` of a profile: off (fp32), or torch.autocast to bf16 or fp16."""
SHORT_PROFILE_STEPS = 2
"""Measured steps of the short profile tune (and recommend) take without ``--profile``: memory
and the phases of a step, not a figure a user reads (that is ``ProfileOptions.steps``)."""
SHORT_PROFILE_WARMUP = 1
"""Steps run first and dropped in tune's short profiles."""
TIME_PROFILE_STEPS = 3
"""Measured steps of tune's second short profile at a larger batch, which the step-time model
is fitted to: taken on the first's warm model, none dropped (the median leaves the first out)."""


def _at_least(record: object, *checks: tuple[str, int]) -> None:
    """Each ``(field, low)``: the record's ``field`` (where given) is at least ``low``, else one
    line naming the field and its flag."""
    for field, low in checks:
        value = getattr(record, field)
        if value is not None and value < low:
            raise AutotuneError(f"{named(field)}: must be >= {low} (got {value})")


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """What one ``autotune profile`` run is asked (bar the model's source and the output). The
    CLI builds it from its flags; the profiler and :func:`autotune.api.profile_script`
    take its defaults."""

    batch_size: int
    """Samples per measured step (``--batch-size``)."""
    steps: int = 20
    """Timed steps; the record reports their medians (``--steps``)."""
    warmup: int = 3
    """Steps run first and dropped (``--warmup``)."""
    device: str = "auto"
    """Where the steps run: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (``--device``)."""
    autocast: str = "off"
    """``off`` (fp32), or torch.autocast to ``bf16`` or ``fp16`` (``--autocast``)."""
    checkpointing: bool = False
    """Checkpoint every block of the block stack (``--checkpointing``)."""

    def __post_init__(self) -> None:
        _at_least(self, ("batch_size", 1), ("steps", 1), ("warmup", 0))
        Machine(device=self.device)  # its --device check, the one there is
        if self.autocast not in AUTOCASTS:
            raise AutotuneError(
                f"{named('autocast')}: must be off, bf16 or fp16 (got {self.autocast!r})"
            )


@dataclass(frozen=True, kw_only=True)
class ConfirmOptions:
    """What one ``autotune confirm`` session is asked (bar the machine's, the model's and the
    output). The CLI builds it from its flags; :func:`autotune.api.confirm` takes its defaults."""

    batch_size: int
    """Micro-batch of the baseline (``--batch-size``)."""
    steps: int = 3
    """Timed steps per arm in each repeat (``--steps``)."""
    repeats: int = 5
    """Interleaved A/B repeats, the sample of the ratio's interval (``--repeats``)."""
    warmup: int = 1
    """Untimed steps per arm before the first repeat (``--warmup``)."""
    loss_tolerance: float = 0.05
    """Largest relative change of the mean loss accepted (``--loss-tolerance``)."""
    max_changes: int = 8
    """Most changes tried in one session (``--max-changes``)."""
    global_batch: int | None = None
    """Target samples per step the policy keeps; ``None``: none (``--global-batch``)."""
    profile_path: str | None = None
    """A saved baseline profile; ``None``: profile the baseline now (``--profile``)."""
    policy_path: str | None = None
    """A policy TOML file; ``None``: the default policy (``--policy``)."""

    def __post_init__(self) -> None:
        _at_least(self, ("batch_size", 1), ("steps", 1), ("repeats", 1), ("warmup", 0),
                  ("max_changes", 1), ("global_batch", 1))  # fmt: skip
        if not 0 < self.loss_tolerance < 1:
            raise AutotuneError(
                f"{named('loss_tolerance')}: must be between 0 and 1 (got {self.loss_tolerance})"
            )


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """What one ``autotune tune`` run is asked. The CLI builds it from its flags, the Python
    API from keywords; the composer and the search read it whole."""

    global_batch: int
    """Samples per optimizer step over all ranks, kept by every plan (``--global-batch``)."""
    trials: int = 20
    """Plans to measure; pruned plans do not count (``--trials``)."""
    budget_s: float | None = None
    """Stop starting trials after this much trial time (``--budget-minutes``, in seconds here)."""
    trial_timeout_s: float = TRIAL_TIMEOUT_S
    """Seconds before a trial's process group is killed (``--trial-timeout-s``)."""
    steps: int = 3
    """Fewest measured optimizer steps per trial (``--steps``), unless the measured steps already
    took ``TrialSettings.max_measure_s`` (15 s): slow steps stop there, at one or more."""
    interval_width: float | None = 0.05
    """Measure until the median step time is known to +- this share; ``None``: exactly
    ``steps`` (``--interval``, where 0 means ``None``)."""
    max_steps: int = 20
    """Most measured steps per trial when measuring to ``interval_width`` (``--max-steps``)."""
    warmup: int = 1
    """Optimizer steps run first in each trial and dropped (``--warmup``)."""
    repeats: int = 3
    """Most rounds of re-runs of the plans overlapping the best; 0: none (``--repeats``)."""
    storage: str | None = None
    """Optuna RDB URL or sqlite path; ``None``: ``autotune-tune.db`` (``--storage``)."""
    study_name: str | None = None
    """The study's name; ``None``: from the model, global batch and ranks (``--study``)."""
    heartbeat_s: int = HEARTBEAT_S
    """Seconds between a running trial's heartbeats (``--heartbeat-s``)."""
    profile_path: str | None = None
    """A saved profile instead of a short fresh one (``--profile``)."""
    policy_path: str | None = None
    """A policy TOML file; ``None``: the default policy (``--policy``)."""
    baseline: Plan | None = None
    """The user's current plan; ``None``: the per-rank batch in one micro-batch (``--baseline``)."""
    engines: tuple[str, ...] | None = None
    """Who may shard a ZeRO stage (``--engines``); ``None``: both of :data:`ENGINES` for a
    model file (the engine a knob of the study where a trial has several ranks), DeepSpeed
    alone for a script (:data:`SCRIPT_ENGINES`)."""
    finish: bool = False
    """Start no trial: read (or run) the study's final comparison (``--finish``)."""
    rdzv_endpoint: str | None = None
    """``HOST:PORT`` of the c10d rendezvous, needed with several nodes (``--rdzv-endpoint``)."""
    join_timeout_s: float = JOIN_TIMEOUT_S
    """Seconds the nodes of a trial wait for each other (``--join-timeout-s``)."""
    front: int = FRONT_SIZE
    """Plans of the predicted front queued early."""
    seed: int | None = None
    """The sampler's seed; ``None``: random, so workers sharing a study differ."""

    def __post_init__(self) -> None:
        _at_least(self, ("global_batch", 1), ("trials", 1), ("steps", 1), ("max_steps", 1),
                  ("warmup", 0), ("repeats", 0), ("heartbeat_s", 1))  # fmt: skip
        for field, flag in (("trial_timeout_s", None), ("join_timeout_s", None),
                            ("budget_s", "--budget-minutes")):  # fmt: skip
            seconds = getattr(self, field)
            if seconds is not None and seconds <= 0:
                raise AutotuneError(f"{named(field, flag)}: must be > 0 (got {seconds:g} s)")
        if self.interval_width is not None and not 0 < self.interval_width < 1:
            raise AutotuneError(
                f"{named('interval_width', '--interval')}: {self.interval_width} is not a share "
                "in [0, 1)"
            )
        bad = [name for name in self.engines or ENGINES if name not in ENGINES]
        if bad or self.engines == ():
            raise AutotuneError(
                f"{named('engines')}: {','.join(bad) or '(none)'}: use deepspeed and/or fsdp2"
            )

    def searched_engines(self, *, script: bool = False) -> tuple[str, ...]:
        """The engines the study may shard with: ``engines`` as given, else the default of a
        model file's tune (both) or a script's (DeepSpeed alone)."""
        return self.engines or (SCRIPT_ENGINES if script else ENGINES)

    def check_machine(self, machine: Machine) -> None:
        """The checks that need the machine too: the batch splits over its ranks and the
        baseline keeps the global batch.

        Raises:
            AutotuneError: one line naming the flag.
        """
        if self.global_batch % machine.world_size:
            ranks = f"{named('nproc_per_node', '--nproc-per-node')} {machine.nproc_per_node}" + (
                f" x {named('nnodes', '--nnodes')} {machine.nnodes}" if machine.nnodes != 1 else ""
            )
            raise AutotuneError(
                f"{named('global_batch')} {self.global_batch} does not split over {ranks}"
            )
        if self.baseline is not None and self.baseline.global_batch != self.global_batch:
            raise AutotuneError(
                f"{named('baseline')}: global batch {self.baseline.global_batch} != "
                f"{named('global_batch')} {self.global_batch}"
            )
