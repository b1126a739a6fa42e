"""The pure outcome classifier, fed with fake errors and results."""

from __future__ import annotations

import pytest

from autotune.search import TrialResult
from autotune.search._outcome import GUARD_EXIT, classify_outcome, outcome_reason

OK = TrialResult(
    completed_steps=3, samples_per_s=10.0, peak_memory_bytes=[100, 120], device_memory=200
)
OVER = TrialResult(
    completed_steps=3, samples_per_s=10.0, peak_memory_bytes=[100, 250], device_memory=200
)
NO_BUDGET = TrialResult(completed_steps=3, samples_per_s=10.0, peak_memory_bytes=[10**12])
# RSS grew far past the budget, but the live tensors (the figure the estimate predicts) fit.
RSS_ONLY_OVER = TrialResult(completed_steps=3, samples_per_s=10.0, peak_memory_bytes=[150],
                            peak_source="cpu_live_tensors", live_tensor_bytes=[150],
                            rss_delta_bytes=[900], device_memory=200)  # fmt: skip
RAISED = TrialResult(error="RuntimeError: shapes do not match")
CUDA_OOM = TrialResult(error="OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB")

CASES = [
    # returncode, timed_out, result, stderr tail, expected
    (0, False, OK, "", "ok"),
    (0, False, NO_BUDGET, "", "ok"),
    (0, False, OVER, "", "oom"),
    (0, False, RSS_ONLY_OVER, "", "ok"),
    (None, True, None, "", "timeout"),
    (None, True, OK, "CUDA out of memory", "timeout"),
    (1, False, CUDA_OOM, "", "oom"),
    (1, False, None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB", "oom"),
    (1, False, None, "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried", "oom"),
    (GUARD_EXIT, False, None, "autotune memory guard: RSS 9 B > limit 8 B", "oom"),
    (-9, False, None, "", "oom"),
    (137, False, None, "", "oom"),
    (1, False, None, "torch.distributed.elastic... exitcode  : -9 (pid: 1234)", "oom"),
    (1, False, RAISED, "Traceback ...\nRuntimeError: shapes do not match", "crash"),
    (1, False, None, "ImportError: no module named foo", "crash"),
    (0, False, None, "", "crash"),
    (0, False, TrialResult(completed_steps=0), "", "crash"),
    (-15, False, None, "", "crash"),
]


@pytest.mark.parametrize(("code", "timed_out", "result", "tail", "expected"), CASES)
def test_classify(code, timed_out, result, tail, expected) -> None:
    assert classify_outcome(code, timed_out, result, tail) == expected


def test_reasons_name_the_cause() -> None:
    assert outcome_reason("ok", OK, "") is None
    assert "timeout" in (outcome_reason("timeout", None, "") or "")
    assert "250 B > budget 200 B" in (outcome_reason("oom", OVER, "") or "")
    live_over = RSS_ONLY_OVER.model_copy(update={"device_memory": 100})
    assert classify_outcome(0, False, live_over, "") == "oom"
    reason = outcome_reason("oom", live_over, "") or ""
    assert "150 B > budget 100 B (cpu_live_tensors)" in reason  # the live figure, not RSS's 900
    assert "OOM killer" in (outcome_reason("oom", None, "") or "")
    assert outcome_reason("crash", RAISED, "") == "RuntimeError: shapes do not match"
    assert outcome_reason("crash", None, "line one\nValueError: bad\n\n") == "ValueError: bad"


# torchrun's own lines after a rank failed (its shape in torch 2.13's elastic launcher).
TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
autotune.runtime.trial.server FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 20383)
============================================================
"""


def test_a_rank_stopped_by_its_memory_guard_is_oom_with_the_guard_named() -> None:
    # The guard's own line was pushed out of the tail by torchrun's traceback: its exit status,
    # which torchrun prints per rank, still says what happened.
    tail = "  File .../launcher/api.py, line 383\n" + TORCHRUN_SUMMARY.format(code=GUARD_EXIT)
    assert classify_outcome(1, False, None, tail) == "oom"
    assert "memory guard" in (outcome_reason("oom", None, tail) or "")
    assert classify_outcome(GUARD_EXIT, False, None, "") == "oom"


def test_a_crash_is_named_by_its_error_not_by_torchruns_summary() -> None:
    tail = ("Traceback (most recent call last):\n  File x.py, line 3\n"
            "RuntimeError: Expected all tensors to be on the same device\n"
            + TORCHRUN_SUMMARY.format(code=1))  # fmt: skip
    assert classify_outcome(1, False, None, tail) == "crash"
    assert outcome_reason("crash", None, tail) == (
        "RuntimeError: Expected all tensors to be on the same device"
    )
    guard_line = "autotune memory guard: RSS 9 B > limit 8 B\n" + TORCHRUN_SUMMARY.format(code=1)
    assert outcome_reason("oom", None, guard_line) == "autotune memory guard: RSS 9 B > limit 8 B"
