"""Trial runners: launch one plan as a child process group (or fake it) and report what happened.

Nothing a trial starts outlives it: every launch goes through the lifeline entry point
(the launcher and each rank get SIGKILL when their parent dies, even by SIGKILL), the
parent kills the launch's process group on every exit path, and trial folders are named
``trial-PID-HOST.*`` (a pooled group's ``group-PID-HOST.*``) so the next runner sweeps
those whose process is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from pydantic import ValidationError

from autotune.records import (
    EXTENSIONS_DIR,
    LIFELINE_ENV,
    EntryPoints,
    Plan,
    TrialResult,
    TrialSettings,
    WorkerSpec,
    write_record,
)
from autotune.search._records import RunReport
from autotune.search._waits import host_lock_deadline, take_flock

_FOLDER = re.compile(r"(?:trial|group)-(?P<pid>\d+)-(?P<host>.+)\.[^.]+")
TAIL_CHARS = 4000
# A launch that dies with one of these before its first step lost a port race or a
# rendezvous, not the plan: it is relaunched on a fresh port.
_RENDEZVOUS = re.compile(
    r"Address already in use|EADDRINUSE|RendezvousError|DistNetworkError|DistStoreError"
    r"|rendezvous|Connection refused|connect\(\) timed out",
    re.IGNORECASE,
)


def torchrun_logs(spec_path: Path) -> Path:
    """torchrun's ``--log-dir``: inside the launch's own folder (the spec's, or a worker
    group's folder itself), removed with it. Without one torchrun makes a ``torchelastic_*``
    folder in the system's temporary directory on every launch and never removes it."""
    folder = spec_path if spec_path.is_dir() else spec_path.parent
    return folder / "torchrun"


class TrialRunner:
    """Runs one plan and reports how the launch ended. Subclass and implement :meth:`run`."""

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        """Run ``plan`` with ``settings`` (never raises for a failing plan)."""
        raise NotImplementedError

    def warm_up(self, plans: list[Plan], settings: TrialSettings) -> float:
        """Pay launcher start-up once before the study; returns the seconds spent."""
        return 0.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_result(path: Path) -> TrialResult | None:
    """The worker's result file, or ``None`` if it is missing or unreadable."""
    try:
        return TrialResult.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError):
        return None


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def folder_prefix(kind: str) -> str:
    """The name prefix of this process's ``kind`` (``trial`` or ``group``) folders."""
    return f"{kind}-{os.getpid()}-{socket.gethostname()}."


def sweep_trial_folders(folder: Path) -> list[Path]:
    """Remove ``trial-PID-HOST.*`` and ``group-PID-HOST.*`` folders left by a process of
    this host that is gone (one killed with SIGKILL cannot remove its own). Returns what
    was removed.
    """
    host, removed = socket.gethostname(), []
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            match = _FOLDER.fullmatch(path.name)
            if match and match["host"] == host and not pid_alive(int(match["pid"])):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def device_units(device: str) -> list[str]:
    """What a launch on ``device`` occupies on this host: each CPU of this process's
    affinity (trials inherit it), or each GPU of ``CUDA_VISIBLE_DEVICES`` (``all`` unset)."""
    if device.startswith("cuda"):
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        return [f"cuda-{v}" for v in visible if v] or ["cuda-all"]
    return [f"cpu-{c}" for c in sorted(os.sched_getaffinity(0))]


def lock_path(unit: str) -> Path:
    """This host's lock file for one device unit (per user)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", unit)
    return Path(tempfile.gettempdir()) / f"autotune-trials-{os.getuid()}-{name}.lock"


@contextlib.contextmanager
def host_lock(units: list[str], deadline_s: float | None = None) -> Iterator[None]:
    """Hold this host's lock of every unit in ``units``: measured work of concurrent
    workers on one machine takes turns where their devices overlap (workers on disjoint
    CPU sets or GPUs run at once) instead of measuring each other's load. A wait says so
    on stderr after a few seconds and ends with :class:`AutotuneError` after ``deadline_s``.
    """
    with contextlib.ExitStack() as held:
        for unit in sorted(set(units)):  # one order in every process: no deadlock
            handle = held.enter_context(lock_path(unit).open("a"))
            take_flock(handle, lock_path(unit), deadline_s=deadline_s,
                       what="another autotune measuring on these devices")  # fmt: skip
            held.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        yield


class SubprocessRunner(TrialRunner):
    """Each trial in a new session: ``python -m WORKER`` for one rank, torchrun for several.

    Args:
        entry_points: the worker and lifeline every launch starts (the composer passes
            the runtime's).
        python: the interpreter.
        retries: relaunches, on a fresh port, of a launch that failed before its
            first step with a port or rendezvous error.
        env: extra environment for the children.
        workdir: where spec and result files go (the system's temporary folder if ``None``).
        one_at_a_time: hold a per-host, per-device lock while a launch runs, so workers
            sharing a machine do not overlap measured work.
    """

    def __init__(
        self,
        *,
        entry_points: EntryPoints,
        python: str = sys.executable,
        retries: int = 2,
        env: Mapping[str, str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        one_at_a_time: bool = True,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.entry_points = entry_points
        self.worker = entry_points.worker
        self.python = python
        self.retries = retries
        self.env = dict(env or {})
        self.workdir = Path(workdir) if workdir is not None else None
        self.one_at_a_time = one_at_a_time
        self._swept = False

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        """Launch ``plan``; relaunch on a fresh port after a rendezvous failure."""
        start = time.monotonic()
        for attempt in range(1, self.retries + 2):
            report = self._launch(plan, settings, warmup_only=False)
            if not _failed_to_start(report) or attempt > self.retries:
                break
        duration = time.monotonic() - start
        return report.model_copy(update={"launches": attempt, "duration_s": duration})

    def warm_up(self, plans: list[Plan], settings: TrialSettings) -> float:
        """One throw-away launch per rank count that starts DeepSpeed (its comm-op compile)."""
        start = time.monotonic()
        shapes = {p.world_size: p for p in plans if p.uses_deepspeed or p.world_size > 1}
        for plan in shapes.values():
            self._launch(plan, settings, warmup_only=True)
        return time.monotonic() - start

    def command(self, plan: Plan, spec_path: Path, port: int) -> list[str]:
        """The launch command for ``plan``'s number of ranks (``spec_path``: the trial's spec,
        or a worker group's folder)."""
        target = EntryPoints.target(self.worker)
        if plan.world_size == 1:
            return [self.python, *target, str(spec_path)]
        return [
            self.python, "-m", "torch.distributed.run", "--nnodes=1",
            f"--nproc-per-node={plan.world_size}", "--master-addr=127.0.0.1",
            f"--master-port={port}", f"--log-dir={torchrun_logs(spec_path)}", *target,
            str(spec_path),
        ]  # fmt: skip

    def child_env(self, plan: Plan, settings: TrialSettings, port: int) -> dict[str, str]:
        """The environment of a launch: rendezvous for one rank, threads, extension cache."""
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", LIFELINE_ENV: str(os.getpid())}
        env.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
        threads = max(1, (os.cpu_count() or 1) // plan.world_size)
        env.setdefault("OMP_NUM_THREADS", str(threads))
        if settings.device == "cpu":
            env.setdefault("DS_ACCELERATOR", "cpu")
        elif settings.device.startswith("cuda"):
            # An inherited DS_ACCELERATOR=cpu (CPU CI exports it) would put DeepSpeed on the host.
            env["DS_ACCELERATOR"] = "cuda"
        if plan.world_size == 1:
            # DeepSpeed looks for MPI unless the single rank is described like this.
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        return env

    def trial_parent(self) -> Path:
        """The folder trial folders go in; the first call sweeps those of dead processes."""
        parent = self.workdir or Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        if not self._swept:
            sweep_trial_folders(parent)
            self._swept = True
        return parent

    def device_lock(self, settings: TrialSettings) -> contextlib.AbstractContextManager[None]:
        """The host lock a launch on ``settings.device`` holds while it runs (none if not
        ``one_at_a_time``)."""
        if not self.one_at_a_time:
            return contextlib.nullcontext()
        return host_lock(device_units(settings.device), host_lock_deadline(settings.timeout_s))

    def guarded(self, cmd: list[str]) -> list[str]:
        """``cmd`` started through the lifeline: it dies with this process, even by SIGKILL."""
        return [self.python, "-m", self.entry_points.lifeline, *cmd]

    def _launch(self, plan: Plan, settings: TrialSettings, *, warmup_only: bool) -> RunReport:
        parent = self.trial_parent()
        with (
            self.device_lock(settings),
            tempfile.TemporaryDirectory(prefix=folder_prefix("trial"), dir=parent) as tmp,
        ):
            folder = Path(tmp)
            result_path = folder / "result.json"
            spec = WorkerSpec(
                settings=settings, plan=plan, result_path=str(result_path), warmup_only=warmup_only
            )
            spec_path = write_record(folder / "spec.json", spec)
            port = free_port()
            requested_at = time.time()
            returncode, timed_out, duration = self._wait(
                self.command(plan, spec_path, port),
                self.child_env(plan, settings, port),
                folder / "stderr.txt",
                settings.timeout_s,
            )
            tail = _tail(folder / "stderr.txt")
            result = read_result(result_path)
        return RunReport(
            returncode=returncode,
            timed_out=timed_out,
            result=result,
            stderr_tail=tail,
            duration_s=duration,
        ).with_fixed_cost(requested_at)

    def _wait(
        self, cmd: list[str], env: dict[str, str], log: Path, timeout: float
    ) -> tuple[int | None, bool, float]:
        start = time.monotonic()
        with log.open("wb") as err:
            # stdout goes to the log too: DeepSpeed prints there, and --json owns our stdout.
            # Through the lifeline: the launch dies with this process even if it is SIGKILLed.
            proc = subprocess.Popen(
                self.guarded(cmd), stdin=subprocess.DEVNULL,
                stdout=err, stderr=err, env=env, start_new_session=True,
            )  # fmt: skip
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                kill_group(proc.pid)
                proc.wait()
                raise
            # Always: grandchildren (DataLoader workers, ranks) must not outlive the trial.
            kill_group(proc.pid)
            proc.wait()
        return (None if timed_out else proc.returncode), timed_out, time.monotonic() - start


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-TAIL_CHARS:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


def _failed_to_start(report: RunReport) -> bool:
    started = report.result is not None and report.result.completed_steps > 0
    return (
        not report.timed_out
        and report.returncode != 0
        and not started
        and bool(_RENDEZVOUS.search(report.stderr_tail))
    )


Behaviour = Callable[[Plan, TrialSettings], TrialResult | str]


class FakeRunner(TrialRunner):
    """A runner for tests: ``behaviour(plan, settings)`` returns a result, or
    ``"timeout"``/``"crash"``/``"oom"`` to fake those endings. Records every plan run.
    """

    def __init__(self, behaviour: Behaviour, *, delay_s: float = 0.0) -> None:
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.plans: list[Plan] = []

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        """Fake one launch of ``plan``."""
        self.plans.append(plan)
        if self.delay_s:
            time.sleep(self.delay_s)
        outcome = self.behaviour(plan, settings)
        if isinstance(outcome, TrialResult):
            return RunReport(returncode=0, timed_out=False, result=outcome, duration_s=self.delay_s)
        if outcome == "timeout":
            return RunReport(
                returncode=None, timed_out=True, result=None, duration_s=settings.timeout_s
            )
        if outcome == "oom":
            tail = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
            return RunReport(
                returncode=1, timed_out=False, result=None, stderr_tail=tail, duration_s=0.0
            )
        tail = f"RuntimeError: fake crash of {plan.describe()}"
        return RunReport(
            returncode=1, timed_out=False, result=None, stderr_tail=tail, duration_s=0.0
        )
