"""The one error type that reaches users as a single line, and the signal that a plan's knob
cannot be applied to this model file."""

from __future__ import annotations


class AutotuneError(Exception):
    """A problem the user can fix: printed as one line, exit status 2.

    The message names the file, field or flag at fault. The CLI prints
    ``autotune: <message>`` without a traceback unless ``--debug`` is given.
    """

    exit_code = 2


class NotApplicable(Exception):
    """A knob of a plan that cannot be applied to this model file automatically.

    Raised before anything is measured, so nothing is reported as measured for it;
    the message says why and which code change the user must make instead.
    """
