"""A trial worker that stays alive: every rank of one group runs trial after trial.

``python -m autotune.runtime.trial.server FOLDER`` (under torchrun for several ranks)
pays interpreter, torch, DeepSpeed and process-group start-up once. The parent
(``autotune.search.PoolRunner``) writes ``FOLDER/request-<n>.json`` (a
:class:`WorkerSpec`); every rank reads it, runs the trial exactly as a fresh
``trial_worker`` would (model and engine built, measured, freed), and rank 0 writes
the spec's result file and then ``FOLDER/done-<n>``. After any failure the process
exits, so the parent relaunches a fresh group: a trial never runs in a process that
an earlier trial broke. A rank also exits when ``FOLDER/stop`` appears, when the
parent is gone (``autotune.runtime.trial.lifeline``, even in the middle of a hung trial), or
after ``AUTOTUNE_IDLE_S`` seconds without a request, so no group outlives the search
that started it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from pathlib import Path

from autotune.records import (
    TrialResult,
    WorkerSpec,
    done_path,
    read_record,
    request_path,
    stop_path,
    write_record,
)
from autotune.runtime.trial.lifeline import die_with_parent
from autotune.runtime.trial.steps import MemoryWatch, exit_now, ranks, shut_down
from autotune.runtime.trial.worker import _iter_lines, run_trial

POLL_S = 0.02
IDLE_S = 1800.0


def wait_for_request(folder: Path, index: int, idle_s: float) -> Path | None:
    """The next request file, or ``None`` when the group should end."""
    path = request_path(folder, index)
    deadline = time.monotonic() + idle_s
    while not path.exists():
        if stop_path(folder).exists() or time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)
    return path


def release_memory() -> None:
    """Collect what the last trial left (cycles, CUDA cache) before the next one is built."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def serve(folder: Path, idle_s: float = IDLE_S) -> int:
    """Run requests in order until told to stop; exit 1 at the first failed trial."""
    rank = ranks()[0]
    watch = MemoryWatch(None)
    try:
        for index in range(sys.maxsize):
            path = wait_for_request(folder, index, idle_s)
            if path is None:
                break
            spec = read_record(path, WorkerSpec, "trial request")
            if not _serve_one(spec, watch, rank, reused=index > 0):
                return 1
            if rank == 0:
                done_path(folder, index).touch()
            release_memory()
    finally:
        watch.stop()
    if stop_path(folder).exists():  # told to stop: every rank is here, leave the group together
        with contextlib.suppress(Exception):
            shut_down()
    return 0


def _serve_one(spec: WorkerSpec, watch: MemoryWatch, rank: int, *, reused: bool) -> bool:
    result_path = Path(spec.result_path)

    def write(result: TrialResult) -> None:
        if rank == 0:
            write_record(result_path, result)

    try:
        result = run_trial(spec, watch, write, reused=reused)
    except Exception as exc:
        sys.stderr.writelines(_iter_lines(exc))
        write(TrialResult(error=f"{type(exc).__name__}: {exc}",
                          device_memory=spec.settings.device_memory, reused=reused))  # fmt: skip
        return False
    write(result)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m autotune.runtime.trial.server FOLDER``."""
    args = sys.argv[1:] if argv is None else argv
    # The group was launched through the lifeline; a rank under torchrun guards itself
    # against torchrun: killed when it goes, even in the middle of a hung trial.
    die_with_parent()
    return serve(Path(args[0]), float(os.environ.get("AUTOTUNE_IDLE_S", IDLE_S)))


if __name__ == "__main__":
    exit_now(main())  # told to stop (the group left together), idle, or after a failed trial
