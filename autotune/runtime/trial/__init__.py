"""The trial processes: the one-trial worker, the pooled server, their steps, the DeepSpeed
and FSDP2 engines they build, and the lifeline every launch starts through.

Kept import-free: the lifeline runs before every trial. The composer injects these
processes into the search by name through :data:`autotune.runtime.trial.entry_points.ENTRY_POINTS`.
"""

__all__ = ["deepspeed_engine", "entry_points", "fsdp2", "lifeline", "server", "steps", "worker"]
