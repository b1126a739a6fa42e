"""The one error type that reaches users as a single line."""

from __future__ import annotations


class AutotuneError(Exception):
    """A problem the user can fix: printed as one line, exit status 2.

    The message names the file, field or flag at fault. The CLI prints
    ``autotune: <message>`` without a traceback unless ``--debug`` is given.
    """

    exit_code = 2
