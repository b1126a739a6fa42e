"""The error types that reach users: a fixable problem (one line, exit 2), SIGTERM, and the
signal that a plan's knob cannot be applied to this model file."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class AutotuneError(Exception):
    """A problem the user can fix: printed as one line, exit status 2.

    The message names the file, field or flag at fault. The CLI prints
    ``autotune: <message>`` without a traceback unless ``--debug`` is given.
    """

    exit_code = 2


def named(field: str, flag: str | None = None) -> str:
    """How every record check names what it refuses: the field a Python caller sets and the
    flag a CLI user gives, ``trials (--trials)`` (``flag`` defaults to the field's own name)."""
    return f"{field} ({flag or '--' + field.replace('_', '-')})"


class Terminated(BaseException):
    """SIGTERM arrived: raised so that ``finally`` blocks run (trials are given back,
    child process groups killed) before the process exits with 128 + the signal.

    A ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` instead of ending the process at once.

    Only in the main thread and only where SIGTERM still has its default action
    (a caller's own handler is left alone); the previous handler comes back on exit.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class NotApplicable(Exception):
    """A knob of a plan that cannot be applied to this model file automatically.

    Raised before anything is measured, so nothing is reported as measured for it;
    the message says why and which code change the user must make instead.
    """
