"""One final comparison per study: which worker runs it, and where its result is kept.

Workers sharing a study each end their search loop on their own. The comparison
(the plans overlapping the best re-run interleaved) is run by the worker that finds no
trial of the study still running, after claiming it; the result goes into the study's
user attributes, keyed by the trials it compared, and every later call (another
worker, a rerun, ``autotune tune --finish``) reads it instead of measuring again.

The claim is atomic in every Optuna RDB storage: it is the creation of a marker
study, ``<study>:final-comparison:<key>``, whose name the storage keeps unique, so of
two workers claiming at once exactly one succeeds. The other waits for the result, as long
as the claimant's re-runs may take, and reads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from autotune.records import TrialSettings
from autotune.search import _study
from autotune.search._compare import OVERHEAD_SHARE, compare, entries
from autotune.search._records import Comparison, TrialRecord
from autotune.search._runner import TrialRunner, pid_alive

ATTR = "final_comparison"
"""The study user attribute holding ``{key, comparison, by}``."""


@dataclass(frozen=True)
class Stored:
    """A comparison read back from the study, and who ran it."""

    comparison: Comparison
    by: str


def comparison_key(ranked: list[TrialRecord], baseline: TrialRecord | None, repeats: int) -> str:
    """What the comparison depends on: the plans it re-runs, in their roles, and the repeats.

    A trial that finishes after the comparison was claimed changes the key only if it
    changes what would be compared (a new best or runner-up): then a new comparison is due.
    """
    chosen = [
        (label, record.plan.model_dump(mode="json")) for label, record in entries(ranked, baseline)
    ]
    digest = hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]
    return f"{digest}-{repeats}r"


def marker_name(study_name: str, key: str) -> str:
    """The marker study whose creation claims the comparison for ``key``."""
    return f"{study_name}:final-comparison:{key}"


def read(study: Any, key: str) -> Stored | None:
    """The stored comparison for ``key`` (``None``: none yet, or one for other trials)."""
    saved = study.user_attrs.get(ATTR)
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None
    try:
        return Stored(Comparison.model_validate(saved["comparison"]), str(saved.get("by", "?")))
    except (KeyError, ValidationError):
        return None


def write(study: Any, key: str, comparison: Comparison) -> None:
    """Keep the comparison in the study for every other worker and rerun."""
    study.set_user_attr(ATTR, {"key": key, "comparison": comparison.model_dump(mode="json"),
                               "by": _study.worker_name()})  # fmt: skip


def claim(study: Any, key: str) -> bool:
    """Claim the comparison for ``key``: ``True`` for exactly one caller per key."""
    return _study.claim(study, marker_name(study.study_name, key))


def still_running(study: Any) -> list[int]:
    """Trials of other workers still running (on this host: only those whose process lives)."""
    from optuna.trial import TrialState as State

    host, mine, busy = socket.gethostname(), os.getpid(), []
    for trial in study.get_trials(deepcopy=False, states=(State.RUNNING,)):
        attrs = trial.user_attrs
        pid = int(attrs.get("pid", -1))
        if attrs.get("host") == host and (pid == mine or not pid_alive(pid)):
            continue
        busy.append(trial.number)
    return busy


def final_comparison(study: Any, ranked: list[TrialRecord], baseline: TrialRecord | None,
                     runner: TrialRunner, settings: TrialSettings, repeats: int,
                     notes: list[str], overhead_s: float = 0.0) -> Comparison | None:  # fmt: skip
    """The study's final comparison: read back, run here once (``overhead_s``: this worker's
    profiles and start-up, :func:`compare`'s), or left to the last worker.

    Returns ``None`` (with a note saying why) when another worker still runs trials, or
    claimed the comparison and has not written it within :func:`claimant_wait_s`;
    ``autotune tune --finish`` reads it later.
    """
    if not ranked:
        return None
    key = comparison_key(ranked, baseline, repeats)
    stored = read(study, key)
    if stored is not None:
        return _read_back(stored, notes)
    busy = still_running(study)
    if busy:
        shown = ", ".join(map(str, busy))
        notes.append(f"trial(s) {shown} still running on other workers: the worker that "
                     "finishes last runs the final comparison; --finish reads it")  # fmt: skip
        return None
    if not claim(study, key):
        wait = claimant_wait_s(ranked, baseline, settings)
        print(f"autotune: another worker claimed the final comparison; waiting up to {wait:.0f} s "
              "for its result", file=sys.stderr, flush=True)  # fmt: skip
        stored = await_comparison(study, key, wait)
        if stored is None:
            notes.append(f"another worker is running the final comparison (not written after "
                         f"{wait:.0f} s): --finish reads it")  # fmt: skip
            return None
        return _read_back(stored, notes)
    comparison = compare(runner, settings, ranked, baseline, repeats, overhead_s)
    write(study, key, comparison)
    return comparison


def _read_back(stored: Stored, notes: list[str]) -> Comparison:
    """A comparison another run wrote, and the note that says so."""
    notes.append(f"final comparison read from the study (run once, by {stored.by})")
    return stored.comparison


def claimant_wait_s(ranked: list[TrialRecord], baseline: TrialRecord | None,
                    settings: TrialSettings) -> float:  # fmt: skip
    """How long the claimant's comparison may take: its re-runs stop starting rounds at
    :data:`~autotune.search._compare.OVERHEAD_SHARE` of the search's trial time, and a round in
    flight ends: every entry and the code change's twin, each run about as long as the search's
    run of it (the trial timeout where unknown), given twice that."""
    searched = sum(record.duration_s or 0.0 for record in ranked)
    listed = [record for _, record in entries(ranked, baseline)] + [ranked[0]]
    round_s = sum(record.duration_s or settings.timeout_s for record in listed)
    return OVERHEAD_SHARE * searched + 2 * round_s


def await_comparison(study: Any, key: str, wait_s: float, poll_s: float = 1.0) -> Stored | None:
    """The comparison for ``key`` once another worker writes it; ``None`` after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        stored = read(study, key)  # Optuna reads the study's attributes from storage each time
        if stored is not None or time.monotonic() >= deadline:
            return stored
        time.sleep(poll_s)
