"""Trial processes die with their parent, even one killed with SIGKILL (no cleanup runs then).

``AUTOTUNE_PARENT_PID`` names the process whose death must end this one. A guarded
process asks the kernel for SIGKILL when its parent goes (``PR_SET_PDEATHSIG`` on
Linux; elsewhere a watchdog thread polls the parent pid), checks that the parent is
still the one named (it may have died before the guard was set), and names itself
for its own children. A process that finds its own pid named was guarded and checked
before an ``exec``; it guards again against its current parent.

``python -m autotune.runtime.trial.lifeline CMD ...`` guards itself and then execs CMD: the
trial runner starts every launch (the worker, or torchrun and through it each rank)
this way. Imports nothing heavy: it runs before every trial.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

ENV = "AUTOTUNE_PARENT_PID"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


def _kernel_guard() -> bool:
    """Ask Linux for SIGKILL when the parent thread exits; ``False`` where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watchdog(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="autotune-lifeline", daemon=True).start()


def die_with_parent() -> bool:
    """Guard this process as the module docstring says.

    Returns:
        ``True`` when guarded; ``False`` when no parent is named (run by hand).
        If the named parent is already gone, the process exits at once (status 1).
    """
    named = os.environ.get(ENV, "")
    if not named.isdigit():
        return False
    parent = int(named)
    if parent == os.getpid():  # guarded before an exec, and checked then: guard again
        parent = os.getppid()  # (a watchdog thread does not survive the exec)
    if not _kernel_guard():
        _watchdog(parent)
    if os.getppid() != parent:
        os._exit(1)
    os.environ[ENV] = str(os.getpid())
    return True


def main(argv: list[str] | None = None) -> None:
    """``python -m autotune.runtime.trial.lifeline CMD ...``: guard, then become CMD."""
    command = sys.argv[1:] if argv is None else argv
    if not command:
        sys.stderr.write("usage: python -m autotune.runtime.trial.lifeline CMD [ARG ...]\n")
        sys.exit(2)
    die_with_parent()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
