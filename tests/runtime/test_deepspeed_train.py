"""Emitted configs really train under deepspeed.initialize on CPU, with 1 and 2 processes.

The first deepspeed.initialize on a machine JIT-compiles a shared-memory comm op
(about a minute); it is cached in $TORCH_EXTENSIONS_DIR, by default here
~/.cache/autotune-torch-extensions (keep that directory between CI runs).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune import deepspeed_config, parse_plan

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")

HERE = Path(__file__).resolve().parents[1]  # tests/
EXTENSIONS = str(Path.home() / ".cache" / "autotune-torch-extensions")
MATRIX = [
    f"stage={stage},precision={precision}" for precision in ("fp32", "bf16") for stage in range(4)
]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a DeepSpeed child: CPU accelerator, one thread per rank, cached ops."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", **extra)
    env.setdefault("TORCH_EXTENSIONS_DIR", EXTENSIONS)
    env.pop("RANK", None)
    return env


def check_training(losses: list[float]) -> None:
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0], f"the loss did not fall on a fixed batch: {losses}"


def train_in_torchrun(tmp_path: Path, knobs_list: list[str], nproc: int) -> dict[str, Any]:
    """Train each plan's emitted config in one ``torchrun`` of ``nproc`` ranks.

    A child process, even for one rank: DeepSpeed patches torch globally (ZeRO-3
    replaces ``F.linear``), which must not leak into the other tests.
    """
    configs = [
        {"name": knobs, "config": deepspeed_config(parse_plan(f"{knobs},nproc_per_node={nproc}"))}
        for knobs in knobs_list
    ]
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               f"--log-dir={tmp_path / 'torchrun'}", str(HERE / "_ds_two_rank.py"), str(tmp_path / "configs.json"), str(tmp_path / "out.json")]  # fmt: skip
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, Any] = json.loads((tmp_path / "out.json").read_text())
    assert sorted(results) == sorted(knobs_list)
    for result in results.values():
        check_training(result["losses"])
    return results


def test_one_process_matrix(tmp_path: Path) -> None:
    results = train_in_torchrun(
        tmp_path, [*MATRIX, "stage=2,precision=amp_bf16", "stage=3,mb=2,ga=2"], 1
    )
    fp32 = [results[f"stage={stage},precision=fp32"]["losses"] for stage in range(4)]
    for losses in fp32[1:]:  # sharding optimizer state, gradients, parameters: same arithmetic
        assert losses == pytest.approx(fp32[0], rel=1e-5)


OFFLOAD = [f"stage={stage},precision=bf16,offload_optimizer=cpu" for stage in (2, 3)]
TINY_PARAMETERS, TINY_LARGEST = 16 * 32 + 32 + 32 * 32 + 32 + 32 + 1, 32 * 32  # _ds_two_rank


def test_two_ranks_in_one_torchrun(tmp_path: Path) -> None:
    results = train_in_torchrun(tmp_path, [*MATRIX, *OFFLOAD], 2)
    for knobs, result in results.items():
        first, second = result["checksums"]
        assert first == pytest.approx(second, rel=1e-6), f"{knobs}: ranks disagree"
    for knobs in OFFLOAD:
        # ZeRO-Offload trains as the plan without it does (its optimizer steps on the host)
        twin = knobs.removesuffix(",offload_optimizer=cpu")
        assert results[knobs]["losses"] == pytest.approx(results[twin]["losses"], rel=1e-5)
        _host_parts_as_predicted(knobs, results[knobs]["host"])


def _host_parts_as_predicted(knobs: str, measured: dict[str, int]) -> None:
    """What DeepSpeed's optimizer keeps on the host, by part, within 5 % of the estimate's
    host side (:func:`autotune.estimator.host_bytes_per_rank`) for the tiny model."""
    from dataclasses import asdict

    from autotune.estimator import host_bytes_per_rank

    plan = parse_plan(f"{knobs},nproc_per_node=2")
    predicted = asdict(host_bytes_per_rank(
        parameters=TINY_PARAMETERS, trainable=TINY_PARAMETERS, precision=plan.precision,
        zero_stage=plan.zero_stage, world_size=2, largest_parameter=TINY_LARGEST,
        offload_optimizer=True,
    ))  # fmt: skip
    assert set(measured) == set(predicted)
    for part, value in predicted.items():
        assert measured[part] == pytest.approx(value, rel=0.05), f"{knobs}: {part}"


def run_example(
    examples_dir: Path, name: str, plan: str, nproc: int = 1, tmp: Path | None = None
) -> dict[str, Any]:
    """Run an example (under torchrun for several ranks); ``tmp``: the run's temporary
    directory (TMPDIR) and torchrun's log folder go there."""
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *([f"--log-dir={tmp / 'torchrun'}"] if tmp is not None else []),
    ]
    command = [*(launcher if nproc > 1 else [sys.executable]), str(examples_dir / name),
               "--plan", plan, "--steps", "3"]  # fmt: skip
    env = child_env(**({"TMPDIR": str(tmp)} if tmp is not None else {}))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900,
                          cwd=examples_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["losses"]) == 3 and all(math.isfinite(x) for x in result["losses"])
    assert result["world_size"] == nproc
    return result


def test_deepspeed_example(examples_dir: Path) -> None:
    result = run_example(examples_dir, "deepspeed_train.py", "stage=3,precision=bf16,mb=2,ckpt=2")
    assert result["plan"] == "precision=bf16,ckpt=2,mb=2,stage=3"


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        ("hf_trainer.py", "stage=2,mb=2,ga=2"),
        ("hf_trainer.py", "stage=3,precision=bf16,mb=2,ga=2,ckpt=2"),
        ("hf_trainer.py", "stage=3,mb=2,ga=2,nproc_per_node=2"),
        ("accelerate_train.py", "stage=2,mb=2,ga=2"),
    ],
)
def test_hf_trainer_and_accelerate_examples(
    examples_dir: Path, name: str, knobs: str, tmp_path: Path
) -> None:
    plan = parse_plan(knobs)
    result = run_example(examples_dir, name, knobs, nproc=plan.world_size, tmp=tmp_path)
    # the Trainer's output folder is removed when it is done
    assert not list(tmp_path.glob("autotune-hf-*")), list(tmp_path.iterdir())
    assert result["deepspeed"] is True
    assert result["resolved"] == {  # the Trainer / Accelerate filled "auto" with the plan's values
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "train_batch_size": plan.global_batch,
        "stage": plan.zero_stage,
    }
