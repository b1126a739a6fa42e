"""Trials over several nodes: the asker posts each launch in the study, one agent per node
launches its local ranks with torchrun's c10d rendezvous, and reports back through the study.

Roles (docs/agent.md shows the commands):

- the **asker**, ``autotune tune --nnodes N --rdzv-endpoint HOST:PORT``, runs the study and
  uses :class:`AgentRunner`: each launch (trial, warm-up or final re-run) becomes a *job*
  stored as the study's user attribute ``autotune:job``;
- an **agent** on every node, ``autotune agent --storage URL --study NAME``, runs
  :func:`serve`: it reads the job, starts ``torchrun --nnodes N --rdzv-backend c10d
  --rdzv-endpoint HOST:PORT --rdzv-id JOB`` for its ``--nproc-per-node`` ranks, and stores
  ``autotune:took:JOB:HOST:PID`` when it takes the job and its report as
  ``autotune:report:JOB:HOST:PID``; a node that has not taken a job within the join
  timeout never joined: the launch ends as a timeout that says so;
- the **rendezvous** is HOST:PORT, a port on one of the nodes: torch's c10d store runs in
  the agent on that host. Nothing but the database and that port crosses nodes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.records import (
    JOIN_TIMEOUT_S,
    AutotuneError,
    EntryPoints,
    Plan,
    TrialSettings,
    redact,
)
from autotune.search import _study
from autotune.search._records import RunReport
from autotune.search._runner import SubprocessRunner, TrialRunner, torchrun_logs
from autotune.search._storage_errors import lost_a_race, storage_error
from autotune.search._waits import Notice, say

JOB_KEY = "autotune:job"
REPORT_PREFIX = "autotune:report:"
ACK_PREFIX = "autotune:took:"
_PACKAGES = ("autotune-advisor", "torch", "deepspeed", "optuna")


def versions() -> dict[str, str]:
    """What must match on every node: Python and the packages a trial runs on."""
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "absent"
    return found


def parse_endpoint(endpoint: str, flag: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``HOST:PORT`` checked: the host must resolve here, the port be a number.

    Raises:
        AutotuneError: one line naming the flag and the value.
    """
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AutotuneError(f"{flag} {endpoint}: expected HOST:PORT, e.g. node0:29400")
    try:
        socket.getaddrinfo(host, int(port))
    except OSError as exc:
        raise AutotuneError(f"{flag} {endpoint}: cannot resolve host {host!r} ({exc})") from None
    return host, int(port)


class RendezvousLauncher(SubprocessRunner):
    """This node's share of one job: torchrun with the c10d rendezvous, never relaunched
    alone (a lone relaunch cannot meet the other nodes again)."""

    def __init__(self, job: dict[str, Any], **kwargs: Any) -> None:
        # No host lock: the ranks of one job must start together, and two agents on one
        # host (a simulated node each) would otherwise wait for each other at the lock
        # while torchrun waits for them at the rendezvous. The asker posts one job at a time.
        super().__init__(retries=0, one_at_a_time=False, **kwargs)
        self.job = job

    def command(self, plan: Plan, spec_path: Path, port: int) -> list[str]:
        """``torchrun`` over ``nnodes`` nodes, this node's ``nproc`` ranks."""
        job = self.job
        target = EntryPoints.target(self.worker)
        return [
            self.python, "-m", "torch.distributed.run", f"--nnodes={job['nnodes']}",
            f"--nproc-per-node={job['nproc']}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={job['rdzv_endpoint']}", f"--rdzv-id={job['id']}",
            f"--rdzv-conf=join_timeout={int(job['join_timeout'])}", "--max-restarts=0",
            f"--log-dir={torchrun_logs(spec_path)}", *target, str(spec_path),
        ]  # fmt: skip

    def child_env(self, plan: Plan, settings: TrialSettings, port: int) -> dict[str, str]:
        """Threads split over this node's ranks, not the whole trial's."""
        env = super().child_env(plan, settings, port)
        if "OMP_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in self.env:
            env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // self.job["nproc"]))
        return env


class AgentRunner(TrialRunner):
    """The asker's runner: each launch is a job the agents run; waits for their reports.

    Args:
        storage: the study's storage (every agent opens the same).
        study_name: the study's name.
        nnodes: nodes per trial, one agent each.
        nproc: ranks per node.
        rdzv_endpoint: ``HOST:PORT`` of the c10d rendezvous, on one of the nodes.
        join_timeout_s: how long the nodes wait for each other at a rendezvous.
        poll_s: how often the reports are read.
    """

    def __init__(self, *, storage: str | None, study_name: str, nnodes: int, nproc: int,
                 rdzv_endpoint: str, join_timeout_s: float = JOIN_TIMEOUT_S,
                 poll_s: float = 1.0) -> None:  # fmt: skip
        if nnodes < 2:
            raise AutotuneError(f"--nnodes: agents are for 2 or more nodes, got {nnodes}")
        if join_timeout_s <= 0:
            raise AutotuneError(f"--join-timeout-s: must be positive, got {join_timeout_s}")
        parse_endpoint(rdzv_endpoint)
        self.storage, self.study_name = storage, study_name
        self.nnodes, self.nproc, self.endpoint = nnodes, nproc, rdzv_endpoint
        self.join_timeout_s, self.poll_s = join_timeout_s, poll_s
        self._study: Any = None

    @property
    def study(self) -> Any:
        """The study, opened on first use (``tune`` creates it first)."""
        if self._study is None:
            self._study = _study.open_study(self.storage, self.study_name)
        return self._study

    def run(self, plan: Plan, settings: TrialSettings) -> RunReport:
        """Post ``plan`` as a job and merge the agents' reports."""
        return self._post(plan, settings, warmup_only=False)

    def warm_up(self, plans: list[Plan], settings: TrialSettings) -> float:
        """Every node pays DeepSpeed's start-up (its comm-op compile) once, before the study."""
        start = time.monotonic()
        shapes = [p for p in plans if p.uses_deepspeed][:1] or plans[:1]
        for plan in shapes:
            self._post(plan, settings, warmup_only=True)
        return time.monotonic() - start

    def close(self) -> None:
        """Tell the agents the study is over: they exit."""
        if self._study is not None:
            self.study.set_user_attr(JOB_KEY, {"id": uuid.uuid4().hex[:12], "stop": True})

    def _post(self, plan: Plan, settings: TrialSettings, warmup_only: bool) -> RunReport:
        job: dict[str, Any] = {
            "id": uuid.uuid4().hex[:12], "plan": plan.model_dump(mode="json"),
            "settings": settings.model_dump(mode="json"), "warmup_only": warmup_only,
            "nnodes": self.nnodes, "nproc": self.nproc, "rdzv_endpoint": self.endpoint,
            "join_timeout": self.join_timeout_s, "versions": versions(), "posted": time.time(),
        }  # fmt: skip
        start, notice = time.monotonic(), Notice()
        self.study.set_user_attr(JOB_KEY, job)
        # Every node must take the job within the join timeout; then the trial has its own.
        joined_by = start + self.join_timeout_s + 5 * self.poll_s
        deadline = joined_by + settings.timeout_s + self.join_timeout_s + 30
        reports: list[dict[str, Any]] = []
        took: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            attrs = self.study.user_attrs
            reports = _reports(attrs, job["id"], REPORT_PREFIX)
            took = _reports(attrs, job["id"], ACK_PREFIX)
            if len(reports) >= self.nnodes or any(_failed_to_start(r) for r in reports):
                break
            if time.monotonic() > joined_by and len(took) < self.nnodes:
                break
            if len(took) < self.nnodes and notice.due():
                say(f"launch {job['id']}: {len(took)} of {self.nnodes} node(s) took it; waiting "
                    f"up to {self.join_timeout_s:.0f} s (--join-timeout-s) for an agent "
                    f"(autotune agent --study {self.study_name}) on each of the others")  # fmt: skip
            time.sleep(self.poll_s)
        return merge_reports(reports, job, time.monotonic() - start, took)


def _reports(attrs: dict[str, Any], job_id: str, kind: str) -> list[dict[str, Any]]:
    prefix = f"{kind}{job_id}:"
    return [value for key, value in sorted(attrs.items()) if key.startswith(prefix)]


def _failed_to_start(report: dict[str, Any]) -> bool:
    result = report.get("result") or {}
    return report.get("returncode") not in (0, None) and not result.get("completed_steps")


def merge_reports(reports: list[dict[str, Any]], job: dict[str, Any], duration_s: float,
                  took: list[dict[str, Any]] | None = None) -> RunReport:  # fmt: skip
    """One :class:`RunReport` from the nodes' reports (pure).

    ``took``: the nodes that took the job (a report implies it). A node that never
    took it makes the launch a timeout whose reason names the rendezvous; else the
    first node that failed gives the exit status and its stderr.
    """
    failed = [r for r in reports if r.get("returncode") != 0 or r.get("timed_out")]
    results = [r["result"] for r in reports if r.get("result")]
    done = [x for x in results if x.get("completed_steps") and not x.get("error")]
    tail = "\n".join(f"[{r.get('host')}] {r.get('stderr_tail', '')[-1500:]}" for r in failed)
    joined = took if took is not None and len(took) > len(reports) else reports
    missing = job["nnodes"] - len(joined)
    if missing > 0:
        hosts = ", ".join(str(r.get("host")) for r in joined) or "none"
        tail += (
            f"\nautotune: {missing} of {job['nnodes']} node(s) never joined the rendezvous at "
            f"{job['rdzv_endpoint']} within {job['join_timeout']:.0f} s (nodes that did: {hosts}); "
            "is an `autotune agent` running on every node?"
        )
    result = (done or results or [None])[0]
    return RunReport.model_validate({
        "returncode": None if missing > 0 else (failed[0]["returncode"] if failed else 0),
        "timed_out": missing > 0 or any(r.get("timed_out") for r in reports),
        "result": result, "stderr_tail": tail.strip()[-4000:], "duration_s": duration_s,
    })  # fmt: skip


def serve(storage: str | None, study_name: str, *, entry_points: EntryPoints,
          idle_timeout_s: float = 1800.0, poll_s: float = 1.0, workdir: str | None = None,
          say: Callable[[str], None] | None = None) -> int:  # fmt: skip
    """Run this node's share of every job the asker posts, until it says stop.

    Args:
        storage: the study's storage (a database every node reaches).
        study_name: the study's name, as ``autotune tune --study`` names it.
        entry_points: the processes a launch starts (the composer's).
        idle_timeout_s: exit after this long without a new job (or without the study).
        poll_s: how often the study is read.
        workdir: where spec and result files go (a temporary folder if ``None``).
        say: called with one line per event.

    Returns:
        The number of jobs this agent ran.

    Raises:
        AutotuneError: the storage cannot be opened.
    """
    tell = say or (lambda line: None)
    study = _wait_for_study(storage, study_name, idle_timeout_s, poll_s, tell)
    tell(f"waiting for the launches of study {study_name} (exits after {idle_timeout_s:.0f} s "
         "without one)")  # fmt: skip
    stale = _stale_at_start(study.user_attrs.get(JOB_KEY) or {})
    served, last = 0, time.monotonic()
    me = f"{socket.gethostname()}:{os.getpid()}"
    while time.monotonic() - last < idle_timeout_s:
        job = study.user_attrs.get(JOB_KEY) or {}
        if job.get("id") in (None, stale):
            time.sleep(poll_s)
            continue
        stale, last = job["id"], time.monotonic()
        if job.get("stop"):
            tell("the asker ended the study")
            return served
        tell(f"job {job['id']}: {Plan.model_validate(job['plan']).describe()}")
        study.set_user_attr(f"{ACK_PREFIX}{job['id']}:{me}", {"host": socket.gethostname()})
        report = run_job(job, entry_points, workdir)
        study.set_user_attr(f"{REPORT_PREFIX}{job['id']}:{me}", report)
        tell(f"job {job['id']}: exit {report['returncode']}, {report['duration_s']:.1f} s")
        served += 1
    tell(f"no job for {idle_timeout_s:.0f} s: exiting")
    return served


def _stale_at_start(job: dict[str, Any]) -> str | None:
    """The id of a job already there that this agent must not run: a stop left by an
    earlier study run, or a launch whose rendezvous window has passed."""
    fresh = time.time() - job.get("posted", 0) < job.get("join_timeout", 0)
    return None if not job or (fresh and not job.get("stop")) else str(job.get("id"))


def _wait_for_study(storage: str | None, name: str, timeout_s: float, poll_s: float,
                    tell: Callable[[str], None]) -> Any:  # fmt: skip
    import optuna

    url = _study.check_storage(storage)
    deadline, told = time.monotonic() + timeout_s, False
    while True:
        try:
            return optuna.load_study(study_name=name, storage=url)
        except KeyError:  # the asker is still profiling
            if time.monotonic() > deadline:
                raise AutotuneError(
                    f"--study {name}: not in {redact(url)} after {timeout_s:.0f} s"
                ) from None
            if not told:
                told = True
                tell(f"study {name} is not in {redact(url)} yet (the asker, autotune tune, "
                     f"creates it after profiling): waiting up to {timeout_s:.0f} s")  # fmt: skip
        except Exception as exc:  # unreachable server, wrong host, bad credentials
            if not lost_a_race(exc):  # agents starting together race to create the schema
                raise storage_error(url, exc) from None
        time.sleep(poll_s)


def run_job(job: dict[str, Any], entry_points: EntryPoints,
            workdir: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Launch this node's ranks of ``job``; the report the asker merges (JSON values)."""
    host = socket.gethostname()
    mine, theirs = versions(), job.get("versions", {})
    differ = [
        f"{k} {theirs[k]} on the asker, {mine.get(k)} here"
        for k in theirs
        if theirs[k] != mine.get(k)
    ]
    try:
        if differ:
            raise AutotuneError(f"versions differ between nodes: {'; '.join(differ)}")
        parse_endpoint(job["rdzv_endpoint"], "the rendezvous endpoint")
    except AutotuneError as exc:
        return {"host": host, "returncode": 2, "timed_out": False, "result": None,
                "stderr_tail": f"autotune: {exc}", "duration_s": 0.0}  # fmt: skip
    plan = Plan.model_validate(job["plan"])
    settings = TrialSettings.model_validate(job["settings"])
    # This node may wait for the others at the rendezvous before the trial's own time starts.
    settings = settings.model_copy(update={"timeout_s": settings.timeout_s + job["join_timeout"]})
    launcher = RendezvousLauncher(job, entry_points=entry_points, python=sys.executable,
                                  workdir=workdir)  # fmt: skip
    warmup = bool(job.get("warmup_only"))
    report = (
        launcher._launch(plan, settings, warmup_only=True)
        if warmup
        else launcher.run(plan, settings)
    )
    return {"host": host, **json.loads(report.model_dump_json())}
