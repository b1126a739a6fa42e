"""A trial runner that keeps one worker group per rank count alive across trials.

A fresh launch pays the interpreter, torch and DeepSpeed imports, the process group and
(on GPUs) CUDA/NCCL start-up before its first step; :class:`PoolRunner` pays them once
per rank count. Each trial still builds its own model and engine, measures and frees
them (the server entry point); after any failure (out of memory, crash,
timeout) the group is gone and the next trial launches a fresh one.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from autotune.records import (
    AutotuneError,
    Plan,
    TrialSettings,
    WorkerSpec,
    done_path,
    request_path,
    stop_path,
    write_record,
)
from autotune.search._records import RunReport
from autotune.search._runner import (
    SubprocessRunner,
    _failed_to_start,
    folder_prefix,
    free_port,
    kill_group,
    read_result,
)
from autotune.search._waits import Notice, say

STARTS_BEFORE_GIVING_UP = 2
"""Trials of one rank count that may time out before their first step, while none of that
rank count ever made one, before the tune stops: its ranks never get through start-up."""

POLL_S = 0.02
STOP_GRACE_S = 5.0


@dataclass
class _Group:
    """One live launch: its process (torchrun or the single rank), folder and stderr log."""

    key: tuple[int, str]
    proc: subprocess.Popen[bytes]
    folder: Path
    log: IO[bytes]
    index: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def submit(self, spec: WorkerSpec, timeout_s: float, requested_at: float) -> RunReport:
        """Hand one spec to every rank; wait for its result, the group's death or the timeout.

        A group's first request that takes more than a few seconds says so on stderr.
        """
        index, self.index = self.index, self.index + 1
        log_path = self.folder / "stderr.txt"
        offset = log_path.stat().st_size
        write_record(request_path(self.folder, index), spec)
        deadline = time.monotonic() + timeout_s
        start = time.monotonic()
        returncode: int | None = None
        timed_out = False
        notice = Notice()
        while True:
            if index == 0 and notice.due():
                say(f"starting a worker group of {self.key[0]} rank(s) on {self.key[1]} "
                    f"(log {log_path}; gives up after {timeout_s:.0f} s, --trial-timeout-s)")  # fmt: skip
            if done_path(self.folder, index).exists():
                returncode = 0
                break
            if self.proc.poll() is not None:
                returncode = self.proc.returncode
                break
            if time.monotonic() > deadline:
                timed_out = True
                kill_group(self.proc.pid)
                self.proc.wait()
                break
            time.sleep(POLL_S)
        tail = _log_tail(log_path, offset)
        report = RunReport(returncode=returncode, timed_out=timed_out,
                           result=read_result(Path(spec.result_path)), stderr_tail=tail,
                           duration_s=time.monotonic() - start)  # fmt: skip
        return report.with_fixed_cost(requested_at)

    def close(self, *, kill: bool = False) -> None:
        """Ask the ranks to exit (or kill them), then remove the folder."""
        if self.log.closed:
            return
        if not kill and self.alive():
            stop_path(self.folder).touch()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_GRACE_S)
        # Always: ranks and their DataLoader workers must not outlive the group.
        kill_group(self.proc.pid)
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _stuck_message(plan: Plan, settings: TrialSettings, report: RunReport, stage: str) -> str:
    lines = [line.strip() for line in report.stderr_tail.splitlines() if line.strip()]
    last = f"; its last output: {lines[-1][:200]}" if lines else "; it printed nothing"
    return (f"a worker group of {plan.world_size} rank(s) on {settings.device} did not reach "
            f"{stage} within --trial-timeout-s {settings.timeout_s:.0f} s (a model import, "
            f"rendezvous or build lock that hangs?){last}")  # fmt: skip


def _log_tail(path: Path, offset: int, chars: int = 4000) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return ""
    return data[-chars:].decode("utf-8", errors="replace")


class PoolRunner(SubprocessRunner):
    """Trials of one rank count share a live worker group; a failure relaunches it fresh.

    Takes :class:`SubprocessRunner`'s arguments (its groups start ``entry_points.server``)
    plus ``idle_s``: a group with no request for this long exits by itself; and
    ``before_launch``, called with a group's environment before it starts (the composer
    clears build locks a killed start left, which the new group's ranks would wait on).
    Use it as a context manager, or call :meth:`close`, to end the groups.
    """

    def __init__(
        self,
        *,
        idle_s: float = 1800.0,
        before_launch: Callable[[Mapping[str, str]], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.worker = self.entry_points.server
        self.idle_s = idle_s
        self.before_launch = before_launch
        self._groups: dict[tuple[int, str], _Group] = {}
        self._started: set[tuple[int, str]] = set()  # rank counts that made a step
        self._stuck: dict[tuple[int, str], int] = {}  # trials timed out before a first step
        atexit.register(self.close)

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        """Run ``plan`` in the live group of its rank count (launched if there is none)."""
        start = time.monotonic()
        for attempt in range(1, self.retries + 2):
            fresh = self._key(plan, settings) not in self._groups
            report = self._submit(plan, settings, warmup_only=False)
            if not (fresh and _failed_to_start(report)) or attempt > self.retries:
                break
        self._check_start(plan, settings, report)
        duration = time.monotonic() - start
        return report.model_copy(update={"launches": attempt, "duration_s": duration})

    def warm_up(self, plans: list[Plan], settings: TrialSettings) -> float:
        """Launch one group per rank count and start DeepSpeed in it (its comm-op compile)."""
        start = time.monotonic()
        shapes = {self._key(p, settings): p for p in plans}
        for plan in shapes.values():
            report = self._submit(plan, settings, warmup_only=True)
            if report.timed_out:
                raise AutotuneError(_stuck_message(plan, settings, report, "its start-up"))
        return time.monotonic() - start

    def _check_start(self, plan: Plan, settings: TrialSettings, report: RunReport) -> None:
        """Stop the tune when trials of a rank count keep timing out before their first step
        and none of that rank count ever made one (a model import or rendezvous that hangs;
        each such trial ran in a group of its own: a time-out ends the group)."""
        key = self._key(plan, settings)
        if report.result is not None and report.result.completed_steps > 0:
            self._started.add(key)
            self._stuck.pop(key, None)
            return
        if not report.timed_out or key in self._started:
            return
        self._stuck[key] = self._stuck.get(key, 0) + 1
        if self._stuck[key] >= STARTS_BEFORE_GIVING_UP:
            raise AutotuneError(_stuck_message(plan, settings, report, "its first step"))

    def live_groups(self) -> dict[tuple[int, str], int]:
        """The launcher pid of each live group, by (ranks, device)."""
        return {key: group.proc.pid for key, group in self._groups.items() if group.alive()}

    def close(self) -> None:
        """End every live group."""
        for key in list(self._groups):
            self._groups.pop(key).close()

    def __enter__(self) -> PoolRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _key(self, plan: Plan, settings: TrialSettings) -> tuple[int, str]:
        return plan.world_size, settings.device

    def _submit(self, plan: Plan, settings: TrialSettings, *, warmup_only: bool) -> RunReport:
        key = self._key(plan, settings)
        group = self._groups.get(key)
        if group is not None and not group.alive():
            self._groups.pop(key).close(kill=True)
            group = None
        with self.device_lock(settings):  # a live group between trials loads nothing
            requested_at = time.time()  # after the wait for the lock: not the trial's cost
            if group is None:
                group = self._groups[key] = self._launch_group(plan, settings)
            spec = WorkerSpec(settings=settings, plan=plan, warmup_only=warmup_only,
                              result_path=str(group.folder / f"result-{group.index}.json"))  # fmt: skip
            report = group.submit(spec, settings.timeout_s, requested_at)
        if report.returncode != 0 or report.timed_out or not group.alive():
            # Nothing an earlier trial broke may measure the next one: relaunch fresh.
            self._groups.pop(key, None)
            group.close(kill=True)
        return report

    def _launch_group(self, plan: Plan, settings: TrialSettings) -> _Group:
        folder = Path(tempfile.mkdtemp(prefix=folder_prefix("group"), dir=self.trial_parent()))
        port = free_port()
        env = self.child_env(plan, settings, port)
        env["AUTOTUNE_IDLE_S"] = str(self.idle_s)
        if self.before_launch is not None:
            self.before_launch(env)
        log = (folder / "stderr.txt").open("ab")
        # stdout goes to the log too: DeepSpeed prints there, and --json owns our stdout.
        proc = subprocess.Popen(
            self.guarded(self.command(plan, folder, port)), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=env, start_new_session=True,
        )  # fmt: skip
        return _Group((plan.world_size, settings.device), proc, folder, log)
