"""Reading a real process's stderr with a deadline in tests."""

from __future__ import annotations

import subprocess
import time


def lines_until(proc: subprocess.Popen[str], text: str, seconds: float) -> list[str]:
    """``proc``'s stderr lines up to the first that holds ``text``, read with a deadline (a
    process that hangs in silence fails the test instead of hanging it); the rest of its
    stderr is still readable with ``communicate``."""
    import queue
    import threading

    assert proc.stderr is not None
    found: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in iter(proc.stderr.readline, ""):
            found.put(line)
            if text in line:
                return
        found.put("")

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + seconds
    lines: list[str] = []
    while True:
        try:
            line = found.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(
                f"no line with {text!r} in {seconds} s: {''.join(lines)}"
            ) from None
        if not line:
            raise AssertionError(f"stderr ended before {text!r}: {''.join(lines)}")
        lines.append(line)
        if text in line:
            return lines
