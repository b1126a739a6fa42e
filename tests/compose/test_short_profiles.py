"""tune's two short profiles: the second is timed steps alone, so it pays for no memory
measure or FLOP count, and the step-time fit reads it as it reads a whole profile. The first
carries it (``second``), as the record `autotune profile` writes does."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.compose._sources import short_profiles
from autotune.estimator import facts_from_profile, fit_step_time
from autotune.records import ProfileRecord, TimedSteps

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_second_short_profile_times_steps_and_fits_like_a_whole_profile() -> None:
    model = EXAMPLES / "mlp_dataloader.py"
    first = short_profiles(model, per_rank=8, device="cpu")
    second = first.second
    assert isinstance(second, TimedSteps) and not isinstance(second, ProfileRecord)
    assert second.config.batch_size == 4 * first.config.batch_size
    # the first measured the probes; the second carries step times only
    assert first.environment.host_adam_per_s and first.time.bf16_over_fp32
    assert second.time.steps_measured == second.config.steps
    # the fit splits the forward into a part per micro-batch and one per sample, through the
    # two measured points (the line through them, at batch 0, clamped to [0, the first's]);
    # the record alone gives it, as a second profile given beside the first does
    base = facts_from_profile(first).baseline
    alone = first.model_copy(update={"second": None})
    assert base is not None and base == fit_step_time(facts_from_profile(alone), second).baseline
    b0, b1 = first.config.batch_size, second.config.batch_size
    f0, f1 = first.time.forward, second.time.forward
    at_zero = f0 - (f1 - f0) / (b1 - b0) * b0
    assert base.forward_fixed == pytest.approx(min(max(at_zero, 0.0), f0))
    assert base.time_fit == f"fixed + per-sample parts from batch {b0} and {b1}"


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
    first = short_profiles(model, per_rank=8, device="cpu")
    second = first.second
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
    first = short_profiles(model, per_rank=8, device="cpu")
    assert first.second is None and first.config.batch_size == 2
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


def _with_operators(ops: int | None, per_op: float | None, forward: float,
                    backward: float) -> ProfileRecord:  # fmt: skip
    from _profiles import synthetic_profile

    record = synthetic_profile(device="cpu", batch_size=2)
    time = record.time.model_copy(update={"ops_per_micro_batch": ops, "seconds_per_op": per_op,
                                          "forward": forward, "backward": backward})  # fmt: skip
    return record.model_copy(update={"time": time})


def test_the_operators_bound_decides_whether_a_second_micro_batch_is_timed() -> None:
    """1000 operators at 5 us, 8 times over: 40 ms a micro-batch at most beyond the samples'
    work. Against a 0.6 s forward and backward that is 6.7 %, over the 5 % line, so the second
    is timed; against 1.0 s, 4 %, and it is not. Without a count there is no bound."""
    from autotune.compose._sources import _second_skipped, per_call_bound

    near = _with_operators(1000, 5e-6, 0.2, 0.4)
    assert per_call_bound(near) == pytest.approx(0.04)
    assert _second_skipped(near) is None
    far = _with_operators(1000, 5e-6, 0.4, 0.6)
    note = _second_skipped(far)
    assert note is not None and "1000 operators" in note and "40 ms" in note and "4.0%" in note
    assert per_call_bound(_with_operators(None, 5e-6, 0.2, 0.3)) is None
    assert _second_skipped(_with_operators(1000, None, 0.2, 0.3)) is None


WIDE = """
import torch

def build_model():
    return torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 1))

def build_batch(batch_size):
    return torch.randn(batch_size, 1024, 2048)

def loss_fn(model, batch):
    return model(batch).mean()
"""


def test_a_model_whose_matmuls_dwarf_its_operators_times_no_second_micro_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two wide Linears over 2048 tokens: 0.2 s of matmul against a few dozen operators.
    The profile counts the operators a micro-batch dispatches (here against a count the test's
    own dispatch mode takes over the same micro-batch of a fresh runner: its batch, forward,
    loss read and backward) and times no second micro-batch (the tiny models above, whose
    operators are most of their step, are timed at a second)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from autotune.runtime._step import TrainRunner
    from autotune.runtime.modelfile import load_model_file

    model = tmp_path / "wide.py"
    model.write_text(WIDE)
    first = short_profiles(model, per_rank=8, device="cpu")
    assert first.second is None and first.config.batch_size == 2
    assert "no timed steps at a second micro-batch" in capsys.readouterr().err

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    runner = TrainRunner(load_model_file(model), device=torch.device("cpu"), precision="fp32",
                         micro_batch=2)  # fmt: skip
    with Count():
        loss = runner.forward(runner.next_batch())
        float(loss.detach())
        runner.backward(loss)
    assert Count.ops > 30  # two Linears forward and backward, at the least
    assert first.time.ops_per_micro_batch == Count.ops
    assert first.time.seconds_per_op is not None and 1e-7 < first.time.seconds_per_op < 1e-3
