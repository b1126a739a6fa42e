"""The suite's guard against code that ends pytest's own process (tests/conftest.py)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from conftest import ExitInTestProcess


def test_os_exit_in_the_test_process_raises_instead_of_ending_the_run() -> None:
    # Without the guard this ends pytest with exit status 3: the run fails, loudly.
    with pytest.raises(ExitInTestProcess, match=r"os\._exit\(3\)"):
        os._exit(3)


def _leave(code: int) -> None:
    os._exit(code)


def test_a_process_forked_from_the_test_process_exits_with_its_code() -> None:
    child = multiprocessing.get_context("fork").Process(target=_leave, args=(7,))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 7
