"""The trial processes by name, as the search launches them (injected by the composer)."""

from __future__ import annotations

from autotune.records import EntryPoints

ENTRY_POINTS = EntryPoints(
    worker="autotune.runtime.trial.worker",
    server="autotune.runtime.trial.server",
    lifeline="autotune.runtime.trial.lifeline",
)
"""What :class:`~autotune.search.SubprocessRunner` and its kin start for every trial."""

__all__ = ["ENTRY_POINTS"]
