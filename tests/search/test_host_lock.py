"""Concurrent workers on one host take turns only where their devices overlap: a real second
process probes the lock files while a first one holds its units."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.search._runner import device_units

HOLD = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from autotune.search._runner import device_units, host_lock
    os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
    with host_lock(device_units("cpu")):
        Path(sys.argv[2]).write_text("held")
        while not Path(sys.argv[3]).exists():
            time.sleep(0.02)
    """
)
PROBE = textwrap.dedent(
    """
    import fcntl, json, os, sys
    from autotune.search._runner import device_units, lock_path
    os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
    busy = []
    for unit in device_units("cpu"):
        with lock_path(unit).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            except BlockingIOError:
                busy.append(unit)
    print(json.dumps(busy))
    """
)


def _probe(cpus: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, cpus], capture_output=True, text=True,
                          env=env, timeout=60, check=True)  # fmt: skip
    busy: list[str] = json.loads(done.stdout)
    return busy


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_disjoint_cpu_sets_do_not_wait_and_overlapping_ones_do(tmp_path: Path) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the lock files of this test only
    held, release = tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(first), str(held), str(release)],
                              env=env)  # fmt: skip
    try:
        while not held.exists():
            assert holder.poll() is None, "the holder died"
            time.sleep(0.02)
        assert _probe(str(second), env) == []
        assert _probe(f"{first},{second}", env) == [f"cpu-{first}"]
    finally:
        release.touch()
        holder.wait(timeout=60)
    assert _probe(f"{first},{second}", env) == []


def test_gpu_units_are_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert device_units("cuda") == ["cuda-2", "cuda-3"]
    assert device_units("cuda:0") == ["cuda-2", "cuda-3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_units("cuda") == ["cuda-all"]
