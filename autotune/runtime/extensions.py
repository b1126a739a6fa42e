"""DeepSpeed's JIT-built comm op: stale torch build locks found and cleared, the op built once
before any trial, in a child process with a deadline.

torch's ``FileBaton`` guards an extension's build folder with a ``lock`` file made with
``O_CREAT | O_EXCL``; the builder keeps it open until it removes it. A builder killed
(SIGKILL, a trial's time-out) leaves the file, and every later load of the op waits on it,
silently and forever. A lock file that no process holds open is such a leftover: it is
removed under a lock of our own (so two autotune processes never remove each other's
fresh lock), and the build runs again (ninja redoes what did not finish).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from autotune.records import EXTENSIONS_DIR, LIFELINE_ENV, AutotuneError

__all__ = [
    "BUILD_TIMEOUT_S",
    "NOTICE_AFTER_S",
    "clear_stale_locks",
    "extensions_root",
    "lock_holders",
    "prebuild_deepspeed",
    "prepare_deepspeed",
    "recover_build_locks",
    "stale_locks",
]

BUILD_TIMEOUT_S = 600.0
"""Least deadline of the comm op's build (about a minute on an idle 2-core machine)."""
NOTICE_AFTER_S = 3.0
"""A wait longer than this says on stderr what it waits for."""
_OP = "deepspeed_shm_comm"
_RECHECK_S = 0.3
_POLL_S = 0.2
_LIFELINE = "autotune.runtime.trial.lifeline"


def extensions_root(env: Mapping[str, str] | None = None) -> Path:
    """The folder torch builds extensions in for a trial (``TORCH_EXTENSIONS_DIR``, else
    the one the trial runner sets)."""
    value = (os.environ if env is None else env).get("TORCH_EXTENSIONS_DIR")
    return Path(value).expanduser() if value else EXTENSIONS_DIR


def lock_holders(lock: Path) -> list[int] | None:
    """The pids of the processes holding ``lock`` open (torch's builder keeps it open while
    it builds) or working in its folder (the build it started); ``None`` when that cannot be told: no ``/proc``, or another user's
    processes hidden from us while the lock belongs to another user.
    """
    try:
        target = lock.stat()
    except FileNotFoundError:
        return []
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    holders, hidden = [], False
    folder = os.path.realpath(lock.parent)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # ninja, orphaned by a killed builder, builds here
            if os.readlink(entry / "cwd") == folder:
                holders.append(int(entry.name))
                continue
        try:
            fds = list((entry / "fd").iterdir())
        except PermissionError:
            hidden = True
            continue
        except OSError:  # the process ended meanwhile
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                held = fd.stat()
                if (held.st_dev, held.st_ino) == (target.st_dev, target.st_ino):
                    holders.append(int(entry.name))
                    break
    if not holders and hidden and target.st_uid != os.getuid():
        return None
    return holders


def _stale(lock: Path) -> bool:
    """Whether ``lock`` exists and stayed unheld over two looks at one file (torch closes
    its lock a moment before it removes it: that moment is not a stale lock)."""
    try:
        first = lock.stat().st_ino
    except FileNotFoundError:
        return False
    if lock_holders(lock) != []:
        return False
    time.sleep(_RECHECK_S)
    try:
        second = lock.stat().st_ino
    except FileNotFoundError:
        return False
    return first == second and lock_holders(lock) == []


def stale_locks(root: Path) -> list[Path]:
    """The build locks under ``root`` that no process holds."""
    return [lock for lock in sorted(root.glob("*/lock")) if _stale(lock)]


@contextlib.contextmanager
def _own_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".autotune-recover.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # held for a /proc scan only: moments
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clear_stale_locks(root: Path) -> list[Path]:
    """Remove the build locks under ``root`` that no process holds (each checked again under
    our own lock, so a fresh lock of another builder is never removed). Returns them."""
    if not any(root.glob("*/lock")):
        return []
    cleared = []
    with _own_lock(root):
        for lock in stale_locks(root):
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
                cleared.append(lock)
    return cleared


def _say(message: str) -> None:
    print(f"autotune: {message}", file=sys.stderr, flush=True)


def prebuild_deepspeed(
    *,
    timeout_s: float = BUILD_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    say: Callable[[str], None] = _say,
) -> float:
    """Build (or load, when built) DeepSpeed's CPU comm op once, in a child process that dies
    with this one, clearing stale build locks first and while it waits.

    Args:
        timeout_s: the deadline of the whole step.
        env: the trials' environment (its ``TORCH_EXTENSIONS_DIR``).
        say: where a wait longer than :data:`NOTICE_AFTER_S` is told (stderr).

    Returns:
        The seconds it took.

    Raises:
        AutotuneError: the build failed, or did not end by the deadline (one line naming
            the build folder, its lock and how to clear it; nothing left running).
    """
    root = extensions_root(env)
    start = time.monotonic()
    for lock in clear_stale_locks(root):
        say(f"removed a stale build lock {lock} (its builder is gone)")
    child_env = {**os.environ, **(env or {}), "TORCH_EXTENSIONS_DIR": str(root),
                 "DS_ACCELERATOR": "cpu", LIFELINE_ENV: str(os.getpid()),
                 "OMP_NUM_THREADS": "1"}  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    deadline = start + timeout_s
    while True:
        returncode, last, cleared = _build_once(root, child_env, deadline, timeout_s, say)
        if returncode == 0:
            return time.monotonic() - start
        if not cleared:  # a child that waited on a dead builder's lock loads what is not built
            raise AutotuneError(f"DeepSpeed's comm op did not build in {root / _OP}: {last}")


def _build_once(root: Path, env: dict[str, str], deadline: float, timeout_s: float,
                say: Callable[[str], None]) -> tuple[int, str, bool]:  # fmt: skip
    """One build child: its exit status, last line, and whether a stale lock was cleared
    while it waited."""
    log = root / f".autotune-build-{os.getpid()}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", _LIFELINE, sys.executable, "-m", __name__],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            cleared = _watch(proc, root, deadline, timeout_s, say)
        finally:  # ninja and the compilers too: nothing of ours outlives the step
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    log.unlink(missing_ok=True)
    return proc.returncode, tail[-1] if tail else f"exit status {proc.returncode}", cleared


def prepare_deepspeed(device: str, timeout_s: float, env: Mapping[str, str] | None = None) -> float:
    """The composer's step before any trial: :func:`prebuild_deepspeed` where trials will
    start DeepSpeed on the CPU (the comm op is JIT-built there; on GPUs it is not), with
    the longer of ``timeout_s`` (a trial's) and :data:`BUILD_TIMEOUT_S` as its deadline (a
    first build on a loaded 2-core machine took over 2 minutes).

    Returns:
        The seconds it took (0 where there is nothing to build).
    """
    import importlib.util

    if device.startswith("cuda") or importlib.util.find_spec("deepspeed") is None:
        return 0.0
    if device == "auto":
        import torch

        if torch.cuda.is_available():
            return 0.0
    return prebuild_deepspeed(timeout_s=max(timeout_s, BUILD_TIMEOUT_S), env=env)


def recover_build_locks(env: Mapping[str, str]) -> None:
    """Before a worker group starts: remove the build locks a killed DeepSpeed start left
    in its ``TORCH_EXTENSIONS_DIR`` (every start takes the comm op's lock for a moment, to
    check its build), saying so on stderr."""
    for lock in clear_stale_locks(extensions_root(env)):
        _say(f"removed a stale build lock {lock} (its builder is gone)")


def _watch(proc: subprocess.Popen[bytes], root: Path, deadline: float, timeout_s: float,
           say: Callable[[str], None]) -> bool:  # fmt: skip
    """Wait for the build child; say what it waits for; clear a lock whose builder died.
    Returns whether it cleared one."""
    lock = root / _OP / "lock"
    told: set[str] = set()
    cleared = False
    notice_at = time.monotonic() + NOTICE_AFTER_S
    while proc.poll() is None:
        now = time.monotonic()
        if now > deadline:
            holders = lock_holders(lock) if lock.exists() else []
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            clear_stale_locks(root)  # the lock our killed child held, if it held one
            owner = f" (lock {lock} held by pid {', '.join(map(str, holders))})" if holders else ""
            raise AutotuneError(
                f"DeepSpeed's comm op did not build within {timeout_s:.0f} s in {root / _OP}"
                f"{owner}; if no build is running, remove {lock}"
            )
        if now > notice_at:
            holders = lock_holders(lock) or []
            if lock.exists() and not holders and clear_stale_locks(root):
                cleared = True
                say(f"removed a stale build lock {lock} (its builder is gone)")
            others = [pid for pid in holders if pid != proc.pid and not _child_of(pid, proc.pid)]
            key = "wait" if others else "build"
            if key not in told:
                told.add(key)
                say(f"waiting for the build lock {lock} held by pid "
                    f"{', '.join(map(str, others))} (another DeepSpeed build)"
                    if others else
                    f"building DeepSpeed's comm op in {root / _OP}, or loading it if built "
                    f"(a first build takes about a minute; deadline {timeout_s:.0f} s)")  # fmt: skip
        time.sleep(_POLL_S)
    return cleared


def _child_of(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` descends from ``ancestor`` (by ``/proc/PID/stat``'s parent pids)."""
    for _ in range(32):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _build() -> None:
    """Build or load the op as ``deepspeed.comm`` does on ``deepspeed.initialize``."""
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()


if __name__ == "__main__":
    _build()
