"""ZeRO-1/2's gradient partition per rank against DeepSpeed's own partitioning of the flat buffer."""

from __future__ import annotations

import os

import pytest
import torch

from autotune.estimator._zero import partition_elements


def _deepspeed_most(sizes: list[int], world_size: int) -> int:
    """The largest rank's ``grads_in_partition`` as DeepSpeed 0.19 sizes it: the flat buffer
    padded to ``2 * world_size`` elements, each rank's slice, and every parameter its
    ``get_partition_info`` puts in that partition, whole (stage_1_and_2.py)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    tensors = [torch.empty(size, device="meta") for size in sizes]
    alignment = 2 * world_size
    padded = -(-sum(sizes) // alignment) * alignment
    most = 0
    for rank in range(world_size):
        inside, _, _ = DeepSpeedZeroOptimizer.get_partition_info(
            None, tensors, padded // world_size, rank
        )
        most = max(most, sum(t.numel() for t in inside))
    return most


def _gpt2_small_sizes() -> list[int]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=256, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    with torch.device("meta"):
        model = GPT2LMHeadModel(config)
    return [p.numel() for p in model.parameters()]  # tied head once, as an optimizer takes them


@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 64])
def test_the_largest_partition_is_deepspeeds(world_size: int) -> None:
    sizes = _gpt2_small_sizes()
    assert partition_elements(tuple(sizes), world_size) == _deepspeed_most(sizes, world_size)


def test_a_cut_parameter_counts_whole_in_both_ranks() -> None:
    sizes = [7, 10, 5, 2]  # the half (12 elements) cuts the second parameter
    assert partition_elements(tuple(sizes), 2) == _deepspeed_most(sizes, 2) == 17
