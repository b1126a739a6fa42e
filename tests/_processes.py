"""Waiting on real processes in tests."""

from __future__ import annotations

import time

import psutil


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has exited (or is a zombie) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
