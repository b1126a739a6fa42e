"""Processes started through the lifeline die with their parent, even one killed with SIGKILL.

Real processes, no torch: a parent script starts children as the trial runner does
(its own session, so a signal to the parent's group never reaches them), then the
test SIGKILLs the parent and asks psutil whether the children are still there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from _processes import gone_within

from autotune.records import LIFELINE_ENV
from autotune.runtime.trial.entry_points import ENTRY_POINTS

LIFELINE_MODULE = ENTRY_POINTS.lifeline

# parent -> lifeline -> "launcher" (a python that starts a "rank" in its own session,
# as torchrun does) -> rank (calls die_with_parent itself, as the trial worker does).
RANK = (
    "import sys, time\n"
    "from autotune.runtime.trial.lifeline import die_with_parent\n"
    "die_with_parent()\n"
    "open(sys.argv[1], 'w').write('ready')\n"
    "time.sleep(600)\n"
)
LAUNCHER = textwrap.dedent(
    """
    import subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1] + ".rank"],
                            start_new_session=True)
    open(sys.argv[1], "w").write(str(rank.pid))
    time.sleep(600)
    """
)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out, launcher, rank = sys.argv[1:4]
    env = {**os.environ, "%s": str(os.getpid())}
    subprocess.Popen([sys.executable, "-m", "%s", sys.executable, "-c", launcher, out, rank],
                     env=env, start_new_session=True)
    time.sleep(600)
    """
) % (LIFELINE_ENV, LIFELINE_MODULE)


def _wait_for(path: Path, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _launcher_pid(parent: int) -> int:
    children = psutil.Process(parent).children()
    assert len(children) == 1
    return children[0].pid


def test_sigkilled_parent_takes_launcher_and_rank_with_it(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    out = tmp_path / "launcher.out"
    parent = subprocess.Popen([sys.executable, str(script), str(out), LAUNCHER, RANK])
    started: list[int] = []
    try:
        rank = int(_wait_for(out))
        started.append(rank)
        _wait_for(Path(f"{out}.rank"))  # the rank is guarded and running
        launcher = _launcher_pid(parent.pid)
        started.append(launcher)
        # The lifeline exec'd the launcher: one process, guarded before the exec.
        assert LIFELINE_MODULE not in psutil.Process(launcher).cmdline()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert gone_within(launcher, 2.0), "the launcher outlived its SIGKILLed parent"
        assert gone_within(rank, 2.0), "the rank outlived its SIGKILLed launcher"
    finally:
        for pid in [parent.pid, *started]:  # a failing run must not leave them behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        parent.wait()


def test_a_child_whose_named_parent_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    # The parent named does not exist (or is not ours): the child must not run on as an orphan.
    env = {**os.environ, LIFELINE_ENV: "999999999"}
    done = subprocess.run([sys.executable, "-m", LIFELINE_MODULE, sys.executable, "-c",
                           "import time; time.sleep(600)"], env=env, timeout=60)  # fmt: skip
    assert done.returncode == 1


def test_without_a_named_parent_the_lifeline_just_runs_the_command() -> None:
    env = {k: v for k, v in os.environ.items() if k != LIFELINE_ENV}
    done = subprocess.run([sys.executable, "-m", LIFELINE_MODULE, sys.executable, "-c",
                           "print('ran')"], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "ran\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_guard_is_the_kernels_on_linux() -> None:
    code = ("import ctypes, os, signal; from autotune.runtime.trial.lifeline import die_with_parent; "
            "assert die_with_parent(); libc = ctypes.CDLL(None); v = ctypes.c_int(); "
            "libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value == signal.SIGKILL)")  # fmt: skip
    env = {**os.environ, LIFELINE_ENV: str(os.getpid())}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.stdout.strip() == "True", done.stderr
