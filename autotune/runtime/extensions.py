"""torch's extension build locks: stale ones found and cleared before a worker group starts;
DeepSpeed's JIT-built CPU comm op kept out of trials.

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
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

from autotune.records import EXTENSIONS_DIR

__all__ = [
    "clear_stale_locks",
    "extensions_root",
    "lock_holders",
    "recover_build_locks",
    "skip_comm_op",
    "stale_locks",
    "trial_deepspeed",
]

_RECHECK_S = 0.3


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


def trial_deepspeed() -> ModuleType:
    """``deepspeed``, imported for a trial: its comm op kept out (:func:`skip_comm_op`)."""
    import deepspeed

    skip_comm_op()
    return deepspeed


def skip_comm_op() -> None:
    """Keep DeepSpeed from building or loading its CPU shared-memory comm op in this process.

    ``deepspeed.comm``'s torch backend JIT-builds that op on its first start on a CPU (25-35 s
    on 2 cores, under torch's build lock) for ``inference_all_reduce`` alone: the all-reduce
    of tensor-parallel inference layers, which no ZeRO or FSDP2 training step calls; their
    collectives are torch.distributed's either way. A trial started without it runs the step
    a training run runs, and a fresh machine neither pays the build nor waits on its lock.
    DeepSpeed keeps the ops it found compatible in ``deepspeed.ops.__compatible_ops__``, one
    dict for the process that its backend reads: the op is marked there as not to be built.
    Where the accelerator has no such op (a GPU's), as DeepSpeed's backend does, nothing is
    read: reading that dict first probes every op, compilers and GPUs included.
    """
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def recover_build_locks(env: Mapping[str, str]) -> None:
    """Before a worker group starts: remove the build locks a killed build left in its
    ``TORCH_EXTENSIONS_DIR``, saying so on stderr. A script's own DeepSpeed config can still
    JIT-build an op in a trial (its CPU Adam, say), and would wait on such a lock forever."""
    for lock in clear_stale_locks(extensions_root(env)):
        _say(f"removed a stale build lock {lock} (its builder is gone)")
