"""torch's extension build locks and DeepSpeed's CPU comm op, in real processes: a lock no process
holds is cleared and a held one is kept; a lock left mid-study is cleared before the next worker
group starts; a 2-rank DeepSpeed tune in an empty extensions folder builds nothing there; where an
accelerator has no comm op (a GPU's), keeping it out probes nothing.

Every experiment runs in a folder of its own (``TORCH_EXTENSIONS_DIR``), never in the one other
runs share.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _models import TINY_MLP_FILE

from autotune.runtime.extensions import (
    clear_stale_locks,
    extensions_root,
    lock_holders,
)

pytest.importorskip("deepspeed")
OP = "deepspeed_shm_comm"
MODEL = TINY_MLP_FILE
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); print('held', flush=True); time.sleep(600)"  # noqa: E501


def _folder(tmp_path: Path) -> Path:
    """An extensions folder with the comm op's build folder in it, as a build leaves it."""
    root = tmp_path / "extensions"
    (root / OP).mkdir(parents=True)
    return root


def test_a_lock_no_process_holds_is_cleared_and_a_held_one_kept(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    lock = root / OP / "lock"
    lock.touch()  # what a builder killed by SIGKILL leaves
    assert lock_holders(lock) == []
    assert clear_stale_locks(root) == [lock]
    assert not lock.exists()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert lock_holders(lock) == [holder.pid]
        assert clear_stale_locks(root) == []  # a build in progress is never touched
    finally:
        holder.kill()
        holder.wait()
    assert lock.exists()  # not ours to remove while its holder lived
    assert clear_stale_locks(root) == [lock]  # now its holder is gone


def _tune(model: Path, run: Path, env: dict[str, str], *, timeout: float = 120,
          nproc: int = 1, trials: int = 1) -> list[str]:  # fmt: skip
    run.mkdir()
    # DeepSpeed's op build is the subject: FSDP2's plans and engine calibrations add nothing.
    return [AUTOTUNE, "tune", str(model), "--global-batch", "2", "--trials", str(trials), "--nproc-per-node",
            str(nproc), "--repeats", "0", "--steps", "1", "--warmup", "0", "--device", "cpu",
            "--storage", str(run / "study.db"), "--out-dir", str(run),
            "--trial-timeout", str(timeout), "--engines", "deepspeed", "--json"]  # fmt: skip


def _env(tmp_path: Path, root: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1",
            "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(root)}  # fmt: skip


@pytest.mark.slow
def test_a_two_rank_deepspeed_tune_in_an_empty_extensions_folder_builds_nothing_there(
    tmp_path: Path,
) -> None:
    root = tmp_path / "fresh-extensions"  # where DeepSpeed's first start would build its comm op
    env = _env(tmp_path, root)
    (tmp_path / "model.py").write_text(MODEL)
    done = subprocess.run(_tune(tmp_path / "model.py", tmp_path / "run", env, nproc=2),
                          capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout)
    assert [t["plan"]["engine"] for t in record["trials"] if t["outcome"] == "ok"] == ["deepspeed"]
    built = sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []
    assert built == [], built


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
    "        open(os.path.join(ext, 'lock'), 'w').close()  # as a build killed midway\n"
    "        raise RuntimeError('injected: a build ended holding its lock')\n",
)


@pytest.mark.slow
def test_a_lock_left_mid_study_is_cleared_before_the_next_group_starts(tmp_path: Path) -> None:
    root = _folder(tmp_path)
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


def test_a_cpu_deepspeed_backend_started_after_skip_comm_op_builds_no_op() -> None:
    from deepspeed.comm.torch import build_shm_op

    from autotune.runtime.extensions import skip_comm_op

    skip_comm_op()
    assert build_shm_op() is None  # DeepSpeed's own step at its backend's start: nothing loaded


NO_SHM_ACCELERATOR = """
import deepspeed.accelerator
import deepspeed.ops


class Gpu:  # an accelerator with no shared-memory comm op, as CUDA's
    def create_op_builder(self, name):
        return None


deepspeed.accelerator.get_accelerator = Gpu
from autotune.runtime.extensions import skip_comm_op

before = "__compatible_ops__" in vars(deepspeed.ops)
skip_comm_op()
print(before, "__compatible_ops__" in vars(deepspeed.ops))
"""


def test_where_the_accelerator_has_no_comm_op_skip_comm_op_probes_no_op() -> None:
    done = subprocess.run([sys.executable, "-c", NO_SHM_ACCELERATOR], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "DS_ACCELERATOR": "cpu"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]  # the probe (compilers, GPUs) never ran
