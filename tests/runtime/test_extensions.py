"""DeepSpeed's comm-op build lock, in real processes: a lock left by a killed builder is
cleared and the op loads; a lock a live process holds is waited on, named, and ends at the
deadline with one line; a tune killed during the first build leaves a next tune that completes.

Every experiment runs in a copy of the extensions folder (``TORCH_EXTENSIONS_DIR``), never
in the one other runs share.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from _models import TINY_MLP_FILE
from _processes import gone_within
from _waiting import lines_until

from autotune.records import AutotuneError
from autotune.runtime.extensions import (
    clear_stale_locks,
    extensions_root,
    lock_holders,
    prebuild_deepspeed,
)

pytest.importorskip("deepspeed")
OP = "deepspeed_shm_comm"
MODEL = TINY_MLP_FILE
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print('held', flush=True); time.sleep(600)"  # noqa: E501


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An extensions folder with the op built: a copy of the shared one (built there if it
    is not yet)."""
    shared = extensions_root()
    if not (shared / OP / f"{OP}.so").exists():
        prebuild_deepspeed(timeout_s=600)
    copy = tmp_path_factory.mktemp("built") / "extensions"
    shutil.copytree(shared / OP, copy / OP, ignore=shutil.ignore_patterns("lock"))
    return copy


def _copy(built: Path, tmp_path: Path) -> Path:
    root = tmp_path / "extensions"
    shutil.copytree(built, root)
    return root


def test_a_stale_lock_is_cleared_and_the_op_loads(built: Path, tmp_path: Path) -> None:
    root = _copy(built, tmp_path)
    (root / OP / "lock").touch()  # what a builder killed by SIGKILL leaves
    assert lock_holders(root / OP / "lock") == []
    told: list[str] = []
    env = {"TORCH_EXTENSIONS_DIR": str(root)}
    prebuild_deepspeed(timeout_s=120, env=env, say=told.append)
    assert not (root / OP / "lock").exists()
    assert told[0] == f"removed a stale build lock {root / OP / 'lock'} (its builder is gone)"


def test_a_held_lock_is_named_and_waited_on_until_the_deadline(built: Path, tmp_path: Path) -> None:
    root = _copy(built, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root / OP / "lock")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert lock_holders(root / OP / "lock") == [holder.pid]
        assert clear_stale_locks(root) == []  # a build in progress is never touched
        told: list[str] = []
        with pytest.raises(AutotuneError) as err:
            prebuild_deepspeed(timeout_s=8, env={"TORCH_EXTENSIONS_DIR": str(root)},
                               say=told.append)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    lock = root / OP / "lock"
    assert (
        f"waiting for the build lock {lock} held by pid {holder.pid} (another DeepSpeed build)"
        in told
    )
    assert str(err.value) == (
        f"DeepSpeed's comm op did not build within 8 s in {root / OP} (lock {lock} held by "
        f"pid {holder.pid}); if no build is running, remove {lock}"
    )
    assert lock.exists()  # not ours to remove while its holder lived
    assert clear_stale_locks(root) == [lock]  # now its holder is gone


def _tune(model: Path, run: Path, env: dict[str, str], *, timeout: float = 120,
          nproc: int = 1, trials: int = 1) -> list[str]:  # fmt: skip
    run.mkdir()
    return [AUTOTUNE, "tune", str(model), "--global-batch", "2", "--trials", str(trials), "--nproc-per-node",
            str(nproc), "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
            "--storage", str(run / "study.db"), "--out-dir", str(run),
            "--trial-timeout", str(timeout), "--json"]  # fmt: skip


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _env(tmp_path: Path, root: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(root)}  # fmt: skip


@pytest.mark.slow
def test_a_tune_killed_during_the_first_build_leaves_a_next_tune_that_completes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "fresh-extensions"  # nothing built: the first tune builds the op
    env = _env(tmp_path, root)
    (tmp_path / "model.py").write_text(MODEL)
    first = subprocess.Popen(_tune(tmp_path / "model.py", tmp_path / "first", env), text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)  # fmt: skip
    try:
        lines_until(first, "building DeepSpeed's comm op", 600)
        lock = root / OP / "lock"
        deadline = time.monotonic() + 120
        while not lock.exists():  # the builder holds torch's lock from here on
            assert time.monotonic() < deadline, "the build never took its lock"
            time.sleep(0.05)
        builders = [pid for pid in lock_holders(lock) or [] if "python" in _name(pid)]
        assert builders, "no builder holds the lock"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    for pid in builders:  # torch's lock holder dies with tune (ninja may finish by itself)
        assert gone_within(pid, 10)
    assert lock.exists()  # left behind: the poison this test is about
    second = subprocess.run(_tune(tmp_path / "model.py", tmp_path / "second", env),
                            capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"autotune: removed a stale build lock {lock}" in second.stderr
    assert '"recommendation"' in second.stdout
    assert not lock.exists()
    assert (root / OP / f"{OP}.so").exists()


def test_the_extensions_folder_follows_the_environment(tmp_path: Path) -> None:
    assert extensions_root({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == tmp_path
    default = textwrap.dedent("from autotune.search import EXTENSIONS_DIR; print(EXTENSIONS_DIR)")
    shown = subprocess.run([sys.executable, "-c", default], capture_output=True, text=True,
                           check=True).stdout.strip()  # fmt: skip
    assert extensions_root({}) == Path(shown)


LEAVES_A_LOCK = MODEL.replace(
    "def build_model():\n",
    "def build_model():\n"
    "    import os\n"
    "    flag = os.environ['LOCK_FLAG']\n"
    "    if os.environ.get('RANK') == '0' and os.path.exists(flag):  # the first trial only\n"
    "        os.remove(flag)\n"
    "        ext = os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'deepspeed_shm_comm')\n"
    "        open(os.path.join(ext, 'lock'), 'w').close()  # as a start killed mid-check\n"
    "        raise RuntimeError('injected: a DeepSpeed start ended holding the build lock')\n",
)


@pytest.mark.slow
def test_a_lock_left_mid_study_is_cleared_before_the_next_group_starts(
    built: Path, tmp_path: Path
) -> None:
    root = _copy(built, tmp_path)
    (tmp_path / "model.py").write_text(LEAVES_A_LOCK)
    (tmp_path / "flag").touch()
    env = {**_env(tmp_path, root), "LOCK_FLAG": str(tmp_path / "flag")}
    cmd = _tune(tmp_path / "model.py", tmp_path / "run", env, nproc=2, trials=2)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "flag").exists(), "the lock was never left"
    assert f"autotune: removed a stale build lock {root / OP / 'lock'}" in done.stderr
    record = json.loads(done.stdout)
    outcomes = [t["outcome"] for t in record["trials"] if t["outcome"]]
    assert outcomes[0] == "crash" and "ok" in outcomes[1:], outcomes
