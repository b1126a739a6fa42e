"""FSDP2's memory accounting: hand-computed cases from the layout torch's fully_shard allocates."""

from __future__ import annotations

import pytest

from autotune.estimator._fsdp import fsdp2_engine_bytes, fsdp2_state_bytes
from autotune.records import AutotuneError, parse_plan


def test_sharded_states_are_16_bytes_per_parameter_over_the_ranks() -> None:
    states = fsdp2_state_bytes(parameters=1000, trainable=1000, world_size=4)
    # fp32 shard 4, fp32 gradient shard 4, Adam m and v 8: (4 + 4 + 8) x 1000 / 4
    assert (states.parameters, states.gradients, states.optimizer_states) == (1000, 1000, 2000)
    assert states.total == 4000 and states.accounting == "fsdp2"
    frozen = fsdp2_state_bytes(parameters=1000, trainable=400, world_size=4)
    assert (frozen.parameters, frozen.gradients, frozen.optimizer_states) == (1000, 400, 800)
    assert fsdp2_state_bytes(parameters=1000, trainable=1000, world_size=4, offload=True).total == 0


@pytest.mark.parametrize(
    ("precision", "reshard", "gathered"),
    [
        # root 200 + 4 blocks of 200; fp32 gathers 4 bytes, bf16 (param_dtype) 2
        ("fp32", True, 4 * (200 + 200)),  # the root and the last block
        ("fp32", False, 4 * 1000),  # every group stays gathered until its backward
        ("bf16", True, 2 * (200 + 200)),
        ("bf16", False, 2 * 1000),
    ],
)
def test_gathered_parameters_at_the_start_of_backward(
    precision: str, reshard: bool, gathered: int
) -> None:
    moments = fsdp2_engine_bytes(
        parameters=1000, trainable=1000, precision=precision, world_size=2,
        reshard_after_forward=reshard, block_parameters=200, num_layers=4,
    )  # fmt: skip
    assert moments["backward"]["parameters"] == 4 * 1000 / 2 + gathered
    assert moments["backward"]["gradients"] == 0  # none yet without accumulation
    assert moments["optimizer"] == {
        "parameters": 2000, "optimizer_states": 4000, "gradients": 2000, "temporaries": 0.0,
    }  # fmt: skip


def test_accumulation_keeps_the_gradient_shards_through_backward() -> None:
    moments = fsdp2_engine_bytes(
        parameters=1000, trainable=1000, precision="fp32", world_size=2,
        reshard_after_forward=True, block_parameters=200, num_layers=4, grad_accum=4,
    )  # fmt: skip
    assert moments["backward"]["gradients"] == 2000


def test_deepspeeds_accounting_refuses_an_fsdp2_plan() -> None:
    from autotune.estimator import ModelFacts
    from autotune.estimator._zero import states_for

    facts = ModelFacts(name="m", parameters=1000, trainable_parameters=1000, activations={})
    with pytest.raises(AutotuneError, match="plan_states"):
        states_for(facts, parse_plan("engine=fsdp2,stage=3"))
