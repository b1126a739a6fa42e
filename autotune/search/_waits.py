"""Waits that say what they wait for: a lock taken with a deadline, told on stderr once it
takes longer than a few seconds (a terminal or not), ended with one line at the deadline."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from autotune.records import AutotuneError

NOTICE_AFTER_S = 3.0
"""A wait longer than this says on stderr what it waits for."""
HOST_LOCK_TRIALS = 3
"""A host lock is held for one launch, bounded by its trial time-out: a wait of this many
time-outs means its holder is stuck (or hogs the devices)."""
_POLL_S = 0.02  # short: a holder between two trials lets go only for a moment


def say(message: str) -> None:
    """One ``autotune: ...`` line on stderr, flushed (a log file reads it at once)."""
    print(f"autotune: {message}", file=sys.stderr, flush=True)


class Notice:
    """When a wait, begun at its making, says what it waits for: once, after
    :data:`NOTICE_AFTER_S`; a shorter wait says nothing. The caller builds its line only then
    (``if notice.due(): say(...)``), so a poll loop pays nothing for it."""

    def __init__(self) -> None:
        self._at = time.monotonic() + NOTICE_AFTER_S

    def due(self) -> bool:
        """``True`` once: the first call after the wait has lasted long enough."""
        if time.monotonic() < self._at:
            return False
        self._at = float("inf")
        return True


def host_lock_deadline(timeout_s: float) -> float:
    """How long a launch waits for the host lock of its devices (see :data:`HOST_LOCK_TRIALS`)."""
    return HOST_LOCK_TRIALS * timeout_s + 60.0


def flock_owners(handle: IO[Any]) -> list[int]:
    """The pids holding a ``flock`` on ``handle``'s file (from ``/proc/locks``; empty where
    there is none, or no ``/proc``)."""
    stat = os.fstat(handle.fileno())
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    owners = []
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if "->" in fields or "FLOCK" not in fields or len(fields) < 6:
            continue  # "->": a waiter, not a holder
        if fields[5] == device and fields[4].isdigit():
            owners.append(int(fields[4]))
    return owners


def take_flock(
    handle: IO[Any],
    path: Path,
    *,
    deadline_s: float | None,
    what: str,
    tell: Callable[[str], None] = say,
) -> None:
    """Take an exclusive ``flock`` on ``handle`` (the open file ``path``).

    Args:
        deadline_s: give up after this many seconds (``None``: wait as long as it takes).
        what: who holds such a lock, for the messages (e.g. "another autotune measuring
            on these CPUs").
        tell: where a wait longer than :data:`NOTICE_AFTER_S` is told.

    Raises:
        AutotuneError: the deadline passed (one line: the file, its holder, what to do).
    """
    start, notice = time.monotonic(), Notice()
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - start
        if notice.due():
            limit = f"; gives up after {deadline_s:.0f} s" if deadline_s is not None else ""
            tell(f"waiting for the lock {path}{_held_by(handle)} ({what}){limit}")
        if deadline_s is not None and waited >= deadline_s:
            raise AutotuneError(
                f"the lock {path}{_held_by(handle)} stayed held for {deadline_s:.0f} s ({what}); "
                "wait for it to finish, or run on other devices"
            )
        time.sleep(_POLL_S)


def _held_by(handle: IO[Any]) -> str:
    owners = flock_owners(handle)
    return f" held by pid {', '.join(map(str, sorted(set(owners))))}" if owners else ""
