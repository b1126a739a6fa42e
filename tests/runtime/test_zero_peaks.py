"""Per-rank peaks of 2-rank ZeRO plans: the estimate against the trial's own measurement.

``bench/zero_peaks.py`` also records torch.profiler inside each rank (the independent
instrument); its figures move from run to run on DeepSpeed engines (bench/RESULTS.md), so this
CI test holds the estimate to the trial's live-tensor peak, which agreed with it per rank.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _models import mlp_stack

from autotune.search._runner import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_rank_zero_1_2_3_plans_are_predicted_within_5_percent_of_the_trials(
    tmp_path: Path,
) -> None:
    model = tmp_path / "mlp.py"
    model.write_text(mlp_stack(blocks=3, width=64, hidden=256))
    plans = ["stage=1,mb=8,ga=2", "stage=2,mb=8,ga=2", "stage=3,mb=8,ga=2"]
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "zero_peaks.py"), str(model), "--profile-batch", "8",
         "--skip-torch", "--plans", *plans],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"\| \S*stage=(\d)\S* \| \d \| ([0-9.]+) \| ([0-9.]+) \|", done.stdout)
    assert len(rows) == 2 * len(plans), done.stdout  # one row per rank
    params = int(re.search(r"([0-9,]+) parameters", done.stdout)[1].replace(",", ""))
    # A ZeRO-1/2 rank's peak is sometimes one fp32 gradient partition (4 * params / 2 bytes,
    # +8.3 % here) higher: gloo's all_reduce may still hold the bucket DeepSpeed flattened for
    # it when DeepSpeed allocates its gradient partition, by thread timing. The estimate
    # counts the two apart, so a rank may exceed the 5 % by that partition and no more
    # (bench/zero_peak_spread.py and its section in bench/RESULTS.md).
    partition_mib = 4 * params / 2 / 2**20
    for stage, predicted, trial in rows:
        low, high = float(predicted) * 0.95, float(predicted) * 1.05
        slack = partition_mib if stage in ("1", "2") else 0.0
        assert low <= float(trial) <= high + slack, done.stdout


@pytest.mark.slow
def test_zero3_keeps_an_fp32_master_copy_beside_its_fp32_partition(tmp_path: Path) -> None:
    """DeepSpeed's own optimizer object: the master is a second storage in fp32 training, which
    the estimate counts (4 bytes per parameter over the ranks)."""
    script = tmp_path / "z3.py"
    script.write_text(Z3_MASTER)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    same, master_bytes, params = json.loads(done.stdout.strip().splitlines()[-1])
    assert not same, "the fp32 master aliases the partition: the estimate counts a copy"
    from autotune.estimator._zero import zero_engine_bytes

    moments = zero_engine_bytes(parameters=params, trainable=params, precision="fp32",
                                zero_stage=3, world_size=1, bucket_elements=params,
                                optimizer_bytes_per_param=8, largest_parameter=0)  # fmt: skip
    # optimizer_states = master + the moments (8 bytes per parameter for AdamW)
    assert moments["backward"]["optimizer_states"] - 8 * params == master_bytes


Z3_MASTER = """
import json, torch, deepspeed
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                       config={"train_batch_size": 2, "zero_optimization": {"stage": 3}})
opt = engine.optimizer
master, part = opt.fp32_partitioned_groups_flat[0], opt.fp16_partitioned_groups_flat[0]
same = master.untyped_storage().data_ptr() == part.untyped_storage().data_ptr()
params = sum(p.ds_numel for p in model.parameters())
print(json.dumps([same, master.numel() * master.element_size(), params]))
"""
