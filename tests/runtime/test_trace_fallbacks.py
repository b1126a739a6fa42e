"""Each of the estimate's trace paths, taken on a model built to need it, with the figure naming
the path and the estimate held to torch.profiler's memory timeline of a real step."""

from __future__ import annotations

from pathlib import Path

import pytest
from _reference import reference_step

from autotune.estimator import estimate_plan
from autotune.records import AutotuneError, Plan
from autotune.runtime.trace import PATH_FAKE, PATH_META_INIT, PATH_REAL, facts_from_model_file

_MODEL = """
import itertools
import torch
from torch import nn

WIDTH = 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)
        {init}

    def forward(self, x):
        {forward}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return Net()


_SEEDS = itertools.cycle(range(4))


def build_batch(batch_size):
    generator = torch.Generator().manual_seed(next(_SEEDS))
    return torch.randn(batch_size, 32, WIDTH, generator=generator), torch.randn(batch_size, 32, 1)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
"""
PLAIN = "return x + self.down(torch.relu(self.up(x)))"
CASES = {
    # nothing unusual: fake tensors trace it
    "plain": ("pass", PLAIN, PATH_FAKE),
    # a truncated-normal init reads values (.item()), which fake tensors cannot give
    "data_dependent_init": (
        "nn.init.trunc_normal_(self.up.weight, std=0.02)",
        PLAIN,
        PATH_META_INIT,
    ),
    # control flow on a value in the forward: only a real step can run it
    "data_dependent_forward": (
        "pass",
        "return x + self.down(torch.relu(self.up(x))) if x.sum() > -1e9 else x",
        PATH_REAL.format(sizes="1 and 2"),
    ),
}


def _file(tmp_path: Path, init: str, forward: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(_MODEL.format(init=init, forward=forward))
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_path_is_taken_and_named_and_its_estimate_holds(case: str, tmp_path: Path) -> None:
    init, forward, path_name = CASES[case]
    path = _file(tmp_path, init, forward)
    facts = facts_from_model_file(path, precisions=("fp32",))
    label = facts.activations["fp32"].path
    assert label is not None and label.startswith(path_name), label
    estimate = estimate_plan(facts, Plan(micro_batch=4))
    # the plan's figure says where it came from
    assert any(note.startswith(f"activations {path_name}") for note in estimate.notes)
    reference = reference_step(path, 4)
    assert estimate.memory.peak == pytest.approx(reference.peak, rel=0.05)


_ROUTED_MODEL = _MODEL.replace(
    "class Block(nn.Module):",
    """def _routed(block, x):
    # the tokens the gate opens for go through the expert; how many depends on the data
    chosen = torch.nonzero(block.gate(x).squeeze(-1) > 0).unbind(1)
    out = torch.zeros_like(x)
    out[chosen] = block.down(torch.relu(block.up(x[chosen])))
    return x + out


class Block(nn.Module):""",
)


def test_data_dependent_activations_are_bounded_over_several_batches(tmp_path: Path) -> None:
    path = tmp_path / "moe.py"
    path.write_text(
        _ROUTED_MODEL.format(
            init="self.gate = nn.Linear(WIDTH, 1)", forward="return _routed(self, x)"
        )
    )
    facts = facts_from_model_file(path, precisions=("fp32",))
    label = facts.activations["fp32"].path or ""
    assert label.startswith(PATH_REAL.format(sizes="1 and 2")), label
    assert "a bound" in label and "spread 0.0 %" not in label, label
    # past the fit's points, the bound covers a real step, and not by much
    predicted = estimate_plan(facts, Plan(micro_batch=16)).memory.peak
    reference = reference_step(path, 16).peak
    assert reference * 0.98 <= predicted <= reference * 1.15


def test_a_model_that_no_path_can_run_is_the_users_error_in_one_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "pass", "return self.missing(x)")
    with pytest.raises(AutotuneError) as raised:
        facts_from_model_file(path, precisions=("fp32",))
    message = str(raised.value)
    assert message.startswith(str(path)) and "missing" in message and "\n" not in message
    assert "fake" not in message  # the trace's own limits never become the user's error


def test_the_real_step_path_refuses_a_model_over_its_limit(tmp_path: Path) -> None:
    _, forward, _ = CASES["data_dependent_forward"]
    path = _file(tmp_path, "pass", forward)
    with pytest.raises(AutotuneError) as raised:
        facts_from_model_file(path, precisions=("fp32",), real_step_limit=1024)
    message = str(raised.value)
    assert "no trace path can run without a real step" in message and "\n" not in message
    assert "--profile" in message
