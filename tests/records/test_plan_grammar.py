"""One grammar for every plan string (``--plan``, ``--baseline``, ``--check``, the Python API):
what it reads, and the one line each mistake gets."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.records import AutotuneError, parse_plan
from autotune.records._plan import Blocks

# fmt: off
READ: list[tuple[str, Blocks, dict[str, Any]]] = [
    # ckpt=all is every one of the L blocks, where L is known
    ("ckpt=all", 4, {"checkpoint_blocks": 4}),
    ("checkpoint=all,mb=2", 32, {"checkpoint_blocks": 32, "micro_batch": 2}),
    ("ckpt=all", 0, {"checkpoint_blocks": 0}),  # a model without a block stack
    ("ckpt=all,stage=2", "later", {"checkpoint_blocks": 0, "zero_stage": 2}),  # L comes later
    ("ckpt=4", 4, {"checkpoint_blocks": 4}),  # every block, by count
    ("ckpt=3", None, {"checkpoint_blocks": 3}),  # L unknown: a count is taken as given
    ("compile=yes,pin_memory=0", None, {"compile": True, "pin_memory": False}),
]

REFUSED: list[tuple[str, Blocks, str]] = [
    # ckpt=all where L is not known
    ("ckpt=all", None, "--plan: ckpt=all: the model's block count L is not known here; give ckpt=N"),
    # more blocks than the model has
    ("ckpt=9", 4, "--plan: ckpt=9: more blocks than the model's L=4"),
    ("checkpoint_blocks=5,mb=2", 4, "--plan: ckpt=5: more blocks than the model's L=4"),
    # a knob without a value names the knob, not "unknown knob"
    ("stage", None, "--plan: stage: give a value, e.g. stage=2"),
    ("mb=4,precision", None, "--plan: precision: give a value, e.g. precision=bf16"),
    ("ga=", None, "--plan: ga: give a value, e.g. ga=8"),
    # each knob once, under any of its names
    ("mb=4,mb=8", None, "--plan: micro_batch given twice (mb=4, mb=8)"),
    ("nproc_per_node=2,nproc_per_node=4", None, "--plan: nproc_per_node given twice (nproc_per_node=2, nproc_per_node=4)"),
    ("stage=2,zero=3", None, "--plan: zero_stage given twice (stage=2, zero=3)"),
    # pydantic's "Value error, " prefix stays out
    ("offload_param=cpu", None, "--plan: 'offload_param=cpu': offload_param needs zero_stage 3"),
    ("engine=fsdp2,stage=1", None, "--plan: 'engine=fsdp2,stage=1': engine=fsdp2 needs zero_stage 2"),
    # a switch is true or false, not anything else
    ("compile=maybe", None, "--plan: compile=maybe: give true or false"),
    ("speed=11", None, "--plan: unknown knob 'speed' (known: "),
]
# fmt: on


@pytest.mark.parametrize(("text", "blocks", "knobs"), READ)
def test_a_plan_string_is_read(text: str, blocks: Blocks, knobs: dict[str, Any]) -> None:
    plan = parse_plan(text, blocks=blocks)
    assert {name: getattr(plan, name) for name in knobs} == knobs


@pytest.mark.parametrize(("text", "blocks", "message"), REFUSED)
def test_a_bad_plan_string_is_one_line(text: str, blocks: Blocks, message: str) -> None:
    with pytest.raises(AutotuneError) as caught:
        parse_plan(text, blocks=blocks)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert "Value error" not in str(caught.value)


def test_the_flag_named_is_the_callers() -> None:
    with pytest.raises(AutotuneError, match=r"^--baseline: micro_batch given twice"):
        parse_plan("mb=1,micro_batch_size=2", flag="--baseline")
