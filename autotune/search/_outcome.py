"""Classify a finished trial launch as ok, out of memory, timeout or crash (pure)."""

from __future__ import annotations

import re
import signal

from autotune.records import GUARD_EXIT, TrialResult
from autotune.search._records import Outcome

# Texts that mean the device or the process ran out of memory, from torch, CUDA,
# the CPU allocator and our own worker-side memory guard.
_OOM_PATTERNS = re.compile(
    r"OutOfMemoryError|CUDA out of memory|out of memory|CUBLAS_STATUS_ALLOC_FAILED"
    r"|DefaultCPUAllocator: can't allocate memory|std::bad_alloc|MemoryError"
    r"|autotune memory guard",
    re.IGNORECASE,
)
_RANK_GUARD = re.compile(rf"exitcode\s*:\s*{GUARD_EXIT}\b")
# torchrun reports a rank killed by a signal in its own words, not in its return code.
_RANK_SIGKILL = re.compile(r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b")
_SIGKILL_CODES = (-signal.SIGKILL, 128 + signal.SIGKILL)
# A Python error's last line ("ValueError: ...") or the trial worker's own "autotune: ..." line;
# torchrun's ChildFailedError and its "=====" summary that follow say nothing of the cause.
_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception|Interrupt)\b.*|autotune: .+)$")
_LAUNCHER = re.compile(r"ChildFailedError")


def classify_outcome(
    returncode: int | None,
    timed_out: bool,
    result: TrialResult | None,
    stderr_tail: str,
) -> Outcome:
    """Decide what became of one trial launch.

    Args:
        returncode: the launcher's exit status (negative: killed by that signal).
        timed_out: whether the parent killed the process group at the timeout.
        result: the result file rank 0 wrote, or ``None`` if it wrote none.
        stderr_tail: the last lines of the launch's stderr.

    Returns:
        ``"timeout"`` if we killed it; ``"oom"`` for a device or CPU out-of-memory
        error, a measured peak above the budget, or a SIGKILL we did not send (the
        kernel's OOM killer); ``"ok"`` for a clean run with a result; else ``"crash"``.
    """
    if timed_out:
        return "timeout"
    error = result.error if result is not None else None
    if _OOM_PATTERNS.search(error or "") or _OOM_PATTERNS.search(stderr_tail):
        return "oom"
    if returncode == 0 and result is not None and error is None and result.completed_steps > 0:
        return "oom" if over_budget(result) else "ok"
    if returncode in (*_SIGKILL_CODES, GUARD_EXIT) or _RANK_SIGKILL.search(stderr_tail):
        return "oom"
    return "oom" if _RANK_GUARD.search(stderr_tail) else "crash"


def over_budget(result: TrialResult) -> bool:
    """Whether the measured peak of any rank exceeds the budget the worker was given."""
    peak = result.peak
    return result.device_memory is not None and peak is not None and peak > result.device_memory


def outcome_reason(outcome: Outcome, result: TrialResult | None, stderr_tail: str) -> str | None:
    """One line saying why a trial did not end ``ok`` (``None`` when it did)."""
    if outcome == "ok":
        return None
    if outcome == "timeout":
        # A launcher that knows more (a node never joined) says so in an "autotune:" line.
        said = [line for line in stderr_tail.splitlines() if line.startswith("autotune: ")]
        return said[-1].removeprefix("autotune: ")[:300] if said else "killed at the trial timeout"
    if outcome == "oom" and result is not None and over_budget(result):
        return f"measured peak {result.peak} B > budget {result.device_memory} B ({result.peak_source})"
    if result is not None and result.error:
        return result.error.splitlines()[-1][:300]
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    if outcome == "oom":
        said = [line for line in lines if _OOM_PATTERNS.search(line)]
        if said:  # the error's own line, not torchrun's summary after it
            return said[-1][:300]
        if _RANK_GUARD.search(stderr_tail):
            return (f"a rank stopped at its memory guard (exit {GUARD_EXIT}): its RSS passed its "
                    "share of this machine's free memory")  # fmt: skip
        return "killed by SIGKILL not sent by autotune (kernel OOM killer)"
    errors = [line for line in lines if _ERROR_LINE.match(line) and not _LAUNCHER.search(line)]
    return (errors or lines or ["exited without a result"])[-1][:300]
