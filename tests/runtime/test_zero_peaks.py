"""Per-rank peaks of 2-rank ZeRO-1/2/3 and FSDP2 stage 2/3 plans against torch's instrument in each rank.

``bench/zero_peaks.py`` runs the plans in one torchrun job of two ranks and reads, inside each
rank, the bytes alive at the measured step's start plus c10's allocation events of the step
from torch.profiler, replayed (``tests/_reference.py::allocator_bounds``): one reference for
both engines (torch's categorised timeline asserts on FSDP2 steps; where it holds, the two
agree to the byte, bench/RESULTS.md). A block freed on gloo's thread reports no free: the
reference is then a range, and a prediction within 5 % of some point of it passes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.search._runner import free_port

REPO = Path(__file__).resolve().parents[2]
PLANS = [
    "stage=1,mb=2,ga=2",
    "stage=2,mb=2",
    "engine=fsdp2,stage=2,mb=2",
    "engine=fsdp2,stage=3,mb=2",
    "stage=3,mb=2",  # last in the rank job: a ZeRO-3 engine keeps its hooks after it
]


GPT2_SOURCE = """
import torch
from transformers import GPT2Config, GPT2LMHeadModel

SEQ_LEN = {seq}
CONFIG = GPT2Config(n_positions=SEQ_LEN, n_embd=384, n_layer={blocks}, n_head=6,
                    vocab_size={vocab}, use_cache=False)


def build_model():
    return GPT2LMHeadModel(CONFIG)


def build_batch(batch_size):
    ids = torch.randint(0, CONFIG.vocab_size, (batch_size, SEQ_LEN))
    return {{"input_ids": ids, "labels": ids}}
"""
"""A model file of transformers' own GPT-2 class, blocks of 384, the head tied to the embedding."""

# 3 blocks and GPT-2's 50k vocabulary: an embedding, tied to the head, of four fifths of the
# parameters. ZeRO-2 and FSDP2 peak at the end of backward with the tied weight's three gradients
# (the head's, the embedding's, their sum: -18.8 % and -10.8 % without them); ZeRO-3 at its
# reduction, with the embedding still gathered and gloo's copy of the flattened bucket (-11.2 %
# without them).
GPT2_WIDE_VOCAB = GPT2_SOURCE.format(seq=256, blocks=3, vocab=50257)

# 4 blocks, a 2k vocabulary and 64 tokens: blocks large beside their activations. FSDP2 stage 3
# peaks after the last block's backward, its reduce-scatter buffers (and gloo's copy of the input)
# held while the next block is gathered and copied out (-11.9 % and, checkpointed, -5.8 % without
# that moment).
GPT2_DEEP_BLOCKS = GPT2_SOURCE.format(seq=64, blocks=4, vocab=2048)


@pytest.mark.slow
def test_two_rank_zero_and_fsdp2_plans_are_predicted_within_5_percent_of_torchs_allocator() -> None:
    _hold_to_reference(REPO / "examples" / "tiny_llama.py", 2, PLANS)


@pytest.mark.slow
def test_a_tied_embedding_larger_than_the_blocks_is_predicted_on_both_zero_stages(
    tmp_path: Path,
) -> None:
    model = tmp_path / "gpt2_wide_vocab.py"
    model.write_text(GPT2_WIDE_VOCAB)
    # no gloo-partition allowance: that mode raises the reduction's moment, which stays below the
    # tied gradients' here
    plans = ["stage=2,mb=1,ckpt=3", "engine=fsdp2,stage=2,mb=1,ckpt=3", "stage=3,mb=1,ckpt=3"]
    _hold_to_reference(model, 1, plans, gloo_mode=False)


@pytest.mark.slow
def test_fsdp2_blocks_large_beside_their_activations_peak_at_the_first_blocks_reduce(
    tmp_path: Path,
) -> None:
    model = tmp_path / "gpt2_deep_blocks.py"
    model.write_text(GPT2_DEEP_BLOCKS)
    _hold_to_reference(model, 1, ["engine=fsdp2,stage=3,mb=1", "engine=fsdp2,stage=3,mb=1,ckpt=4"])


def _hold_to_reference(
    model: Path, profile_batch: int, plans: list[str], *, gloo_mode: bool = True
) -> None:
    """Each plan's rank rows within 5 % of the in-rank reference's range (one 2-rank job), and
    with ``gloo_mode`` a ZeRO-1/2 row up to one gradient partition above."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "zero_peaks.py"), str(model), "--profile-batch",
         str(profile_batch), "--no-trial", "--plans-per-job", str(len(plans)), "--timeout", "900",
         "--plans", *plans],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(
        r"\| (\S+) \| \d \| ([0-9.]+) \| (?:([0-9.]+)–)?([0-9.]+) \| [+-][0-9.]+%", done.stdout
    )  # plan, predicted, reference (MiB, low–high where a free was on gloo's thread)
    assert len(rows) == 2 * len(plans), done.stdout + done.stderr[-3000:]
    params = int(re.search(r"([0-9,]+) parameters", done.stdout)[1].replace(",", ""))
    # The one measured mode: a ZeRO-1/2 rank's peak is sometimes one fp32 gradient partition
    # (4 * params / 2 bytes) higher, when gloo's all_reduce work object still holds the bucket
    # DeepSpeed flattened for it as DeepSpeed allocates its gradient partition (3 of 10 rank
    # peaks; bench/RESULTS.md "ZeRO-1/2 per-rank peaks move by one gradient partition"). The
    # estimate counts the two apart, so such a rank may exceed the 5 % by that partition.
    partition_mib = 4 * params / 2 / 2**20
    for plan, predicted, low, high in rows:
        gloo = gloo_mode and "fsdp2" not in plan and ("stage=1" in plan or "stage=2" in plan)
        # the reference lies in [low, high]; some point of it within 5 % of the prediction
        allowed = (
            float(predicted) * 0.95,
            float(predicted) * 1.05 + (partition_mib if gloo else 0),
        )
        assert float(low or high) <= allowed[1] and float(high) >= allowed[0], done.stdout


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
