"""tune's two short profiles: the second is timed steps alone, so it pays for no memory
measure, FLOP count or probe, and the step-time fit reads it as it reads a whole profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.compose._sources import short_profiles
from autotune.estimator import facts_from_profile, fit_step_time
from autotune.records import ProfileRecord, TimedSteps

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_second_short_profile_times_steps_and_fits_like_a_whole_profile() -> None:
    model = EXAMPLES / "mlp_dataloader.py"
    first, second = short_profiles(model, per_rank=8, device="cpu")
    assert isinstance(second, TimedSteps) and not isinstance(second, ProfileRecord)
    assert second.config.batch_size == 4 * first.config.batch_size
    # the first measured the probes; the second carries step times only
    assert first.environment.host_adam_per_s and first.time.bf16_over_fp32
    assert second.time.steps_measured == second.config.steps
    # the fit splits the forward into a part per micro-batch and one per sample, through the
    # two measured points (the line through them, at batch 0, clamped to [0, the first's])
    base = fit_step_time(facts_from_profile(first), second).baseline
    assert base is not None
    b0, b1 = first.config.batch_size, second.config.batch_size
    f0, f1 = first.time.forward, second.time.forward
    at_zero = f0 - (f1 - f0) / (b1 - b0) * b0
    assert base.forward_fixed == pytest.approx(min(max(at_zero, 0.0), f0))
    assert f"profile at batch {b1}" in base.time_fit


COUNTING = """
import torch

BUILT = []
SEEN = []

def build_model():
    BUILT.append(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))

def build_batch(batch_size):
    return torch.randn(batch_size, 8)

def loss_fn(model, batch):
    SEEN.append(batch.shape[0])
    return model(batch).mean()
"""


def test_the_second_short_profile_reuses_the_first_ones_model_and_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One model built for both (no second start-up, optimizer state or first step): every
    step the profile ran at micro-batch 2, then exactly the second's three timed steps at 8."""
    from autotune.runtime import modelfile

    model = tmp_path / "counting.py"
    model.write_text(COUNTING)
    loaded: list[modelfile.ModelFile] = []
    load = modelfile.load_model_file

    def keep(path: str | Path) -> modelfile.ModelFile:
        loaded.append(load(path))
        return loaded[-1]

    monkeypatch.setattr("autotune.runtime.profiler.load_model_file", keep)
    first, second = short_profiles(model, per_rank=8, device="cpu")
    assert second is not None and second.config.batch_size == 8 and second.config.warmup == 0
    assert len(loaded) == 1
    module = loaded[0].module
    assert module.BUILT == [1]
    seen = module.SEEN
    assert seen[-3:] == [8, 8, 8] and set(seen[:-3]) <= {1, 2}, seen
    assert second.time.steps_measured == 3 == second.config.steps
    assert first.config.batch_size == 2


OOM_ABOVE_2 = """
import torch

def build_model():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))

def build_batch(batch_size):
    return torch.randn(batch_size, 8)

def loss_fn(model, batch):
    if batch.shape[0] > {limit}:  # as a GPU answers a step that does not fit
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
    return model(batch).mean()
"""


def test_a_second_profile_that_runs_out_of_memory_leaves_the_first_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "oom.py"
    model.write_text(OOM_ABOVE_2.replace("{limit}", "2"))
    first, second = short_profiles(model, per_rank=8, device="cpu")
    assert second is None and first.config.batch_size == 2
    assert "the timed steps at micro-batch 8 ran out of memory" in capsys.readouterr().err


def test_a_first_profile_that_runs_out_of_memory_is_one_line_naming_the_batch(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    model = tmp_path / "oom.py"
    model.write_text(OOM_ABOVE_2.replace("{limit}", "1"))
    result = CliRunner().invoke(app, ["profile", str(model), "-b", "2", "--steps", "1"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the step at micro-batch 2 (fp32) ran out of cpu memory" in lines[0]
    assert "internal error" not in lines[0]


def test_the_second_profile_stays_inside_the_gpus_memory() -> None:
    """A GPU profile at micro-batch 8: 20 GB at its peak of an 80 GB GPU, 1 GB of activations
    per sample. The margin keeps 8 GB free, so 52 GB more hold 52 samples more: micro-batch
    60 at most (the CPU has no such bound)."""
    from _profiles import synthetic_profile

    from autotune.compose._sources import _largest_fitting_batch

    record = synthetic_profile(device="cuda", batch_size=8, activations_per_sample=1e9)
    memory = record.memory.model_copy(update={"peak": 20 * 10**9})
    assert _largest_fitting_batch(record.model_copy(update={"memory": memory})) == 60
    assert _largest_fitting_batch(synthetic_profile(device="cpu")) > 10**9
