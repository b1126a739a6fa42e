"""Workers sharing one study: heartbeats while a trial runs, lost trials recovered and rerun,
and a worker that finishes early waiting for the others' trials in flight.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from autotune.search import _study
from autotune.search._waits import Notice, say


class Heartbeat:
    """Beat for ``trial`` every heartbeat interval of the study's storage, in a thread.

    Use as a context manager around everything a worker does for one trial: while it
    beats, no other worker takes the trial for lost.
    """

    def __init__(self, study: Any, trial: Any) -> None:
        self.study, self.trial = study, trial
        self.interval = _study.heartbeat_interval(study)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="autotune-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            _study.beat(self.study, self.trial)

    def __enter__(self) -> Heartbeat:
        if self.interval > 0:
            _study.beat(self.study, self.trial)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:  # fmt: skip
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def retries_waiting(study: Any) -> bool:
    """Whether a trial given back or lost was queued again and no worker has taken it yet.

    A retry runs even when the study has its count of measured trials: the plan
    was started and must be measured, not dropped.
    """
    from optuna.trial import TrialState as State

    return any(map(_study.is_retry, study.get_trials(deepcopy=False, states=(State.WAITING,))))


def recover(study: Any, notes: list[str]) -> None:
    """Fail and requeue the trials of dead workers, noting each once: at once for a
    process of this host that is gone, after 3 silent heartbeats for any other."""
    for number in _study.fail_dead_local(study):
        notes.append(f"trial {number} was left running by a killed process: "
                     "marked failed and queued again")  # fmt: skip
    for number in _study.recover_stale(study):
        notes.append(
            f"trial {number} lost its worker (no heartbeat for 3 intervals): "
            "marked failed and queued again"
        )


def settle(study: Any, notes: list[str], max_wait_s: float, poll_s: float | None = None) -> bool:
    """Wait until no other worker's trial is running; recover any whose worker died.

    Every worker then reads the same finished trials, so their recommendations agree.
    A trial still running after ``max_wait_s`` (longer than any launch may take) is
    left to its worker, with a note.

    Returns:
        True when a lost trial was queued again meanwhile (the caller runs it).
    """
    from optuna.trial import TrialState as State

    poll = poll_s if poll_s is not None else min(2.0, _study.heartbeat_interval(study) or 1.0)
    deadline, notice = time.monotonic() + max_wait_s, Notice()
    while True:
        recover(study, notes)
        if retries_waiting(study):
            return True
        running = study.get_trials(deepcopy=False, states=(State.RUNNING,))
        if not running:
            return False
        if notice.due():
            say(f"waiting up to {max_wait_s:.0f} s for trial(s) {_workers(running)} of other "
                "workers to finish, so that every worker recommends from the same trials")  # fmt: skip
        if time.monotonic() > deadline:
            numbers = ", ".join(str(t.number) for t in running)
            notes.append(
                f"stopped waiting for trial(s) {numbers} of other workers after {max_wait_s:.0f} s"
            )
            return False
        time.sleep(poll)


def _workers(trials: list[Any]) -> str:
    """Trials with the worker running each, as its heartbeat's attributes name it."""
    named = []
    for trial in trials:
        attrs = trial.user_attrs
        where = (
            f"pid {attrs['pid']} on {attrs['host']}" if "pid" in attrs and "host" in attrs else ""
        )
        named.append(f"{trial.number} ({where})" if where else str(trial.number))
    return ", ".join(named)
