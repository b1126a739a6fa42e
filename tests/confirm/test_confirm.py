"""confirm: real interleaved A/B steps keep a change that helps and reject one that hurts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _profiles import synthetic_profile
from typer.testing import CliRunner

from autotune.api import confirm
from autotune.cli import app
from autotune.records import write_record

os.environ.setdefault("OMP_NUM_THREADS", "1")

ALWAYS_AUTOCAST = """
extends = "default"

[[rule]]
id = "mixed_precision"
order = 20
all = [["precision", "==", "fp32"]]
action = "mixed_precision"
reason = "Test policy: try bf16 autocast whatever the device."
"""


@pytest.mark.slow
def test_keeps_dataloader_workers_for_a_sleep_bound_loader(examples_dir: Path) -> None:
    record = confirm(examples_dir / "slow_input.py", batch_size=16, steps=2, repeats=5)
    first = record.steps[0]
    assert first.rule == "input_bound"
    assert first.status == "kept", first.why
    assert first.measured is not None
    assert first.measured.ratio_interval[1] < 1.0
    assert first.measured.after_step_s < first.measured.before_step_s
    # Same seed, same batches in the same order: the losses agree.
    assert first.measured.loss_delta is not None and first.measured.loss_delta < 0.01
    assert record.final_plan.dataloader_workers == 4


def _cpu_has_native_bf16() -> bool:
    """AMX or AVX-512 BF16 in the kernel's CPU flags (oneDNN's bf16 matmul kernels need one)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True  # unknown: only the interval rule below is checked
    return "amx_bf16" in flags or "avx512_bf16" in flags


@pytest.mark.slow
def test_bf16_autocast_is_kept_only_when_its_interval_says_faster(
    examples_dir: Path, tmp_path: Path
) -> None:
    """On a CPU without native bf16 (AVX2 only) autocast emulates it and is measured slower; on
    one with AMX it may be faster or even. Either way the verdict follows the measured interval
    of the step-time ratio (METHOD.md section 7: a speedup only when the interval excludes 1)."""
    policy = tmp_path / "autocast.toml"
    policy.write_text(ALWAYS_AUTOCAST)
    record = confirm(
        examples_dir / "mlp_dataloader.py", batch_size=32, steps=2, repeats=5, policy_path=policy
    )
    step = next(item for item in record.steps if item.rule == "mixed_precision")
    assert step.measured is not None
    low, high = step.measured.ratio_interval
    if not _cpu_has_native_bf16():
        assert low > 1.0 and step.status == "rejected" and step.why.startswith("slower"), step.why
    if high < 1.0:
        assert step.status == "kept" and record.final_plan.precision == "amp_bf16", step.why
    else:
        assert step.status == "rejected" and record.final_plan.precision == "fp32", step.why
        assert step.why.startswith("slower" if low > 1.0 else "not clearly faster"), step.why


def test_zero_changes_are_logged_as_not_confirmable(examples_dir: Path, tmp_path: Path) -> None:
    # A GPU profile (offload frees device memory only there) whose states do not fit, with
    # the lossless-speed rules off so that the first change is the DeepSpeed one.
    profile = write_record(
        tmp_path / "p.json",
        synthetic_profile(device="cuda", bf16_ratio=0.15, parameters=7_000_000_000),
    )
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'extends = "default"\ndisable = ["input_bound", "mixed_precision", '
        '"mixed_precision_for_memory", "fp16_loss_scaling", "flash_attention", '
        '"sdpa_attention", "compile", "activation_checkpointing"]\n'
    )
    out = tmp_path / "session.json"
    args = [
        "confirm", str(examples_dir / "mlp_dataloader.py"), "--batch-size", "8",
        "--profile", str(profile), "--device-memory", "80GB", "--max-changes", "1",
        "--policy", str(policy), "--output", str(out), "--json",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(out.read_text())
    step = data["steps"][0]
    assert step["status"] == "not_confirmable" and step["measured"] is None
    assert "zero_stage" in step["why"] and "autotune tune" in step["why"]
    text = CliRunner().invoke(app, [*args[:-1]])
    assert text.exit_code == 0, text.output
    assert "offload_optimizer" in text.stdout and "NOT_CONFIRMABLE" in text.stdout


def test_bad_loss_tolerance_is_a_user_error(examples_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["confirm", str(examples_dir / "slow_input.py"), "-b", "4", "--loss-tolerance", "2"]
    )
    assert result.exit_code == 2 and "--loss-tolerance" in result.stderr


def test_profile_of_another_batch_size_is_a_user_error(examples_dir: Path, tmp_path: Path) -> None:
    profile = write_record(tmp_path / "p.json", synthetic_profile(device="cpu", batch_size=8))
    result = CliRunner().invoke(
        app,
        ["confirm", str(examples_dir / "mlp_dataloader.py"), "-b", "4", "--profile", str(profile)],
    )
    assert result.exit_code == 2 and "differs from the profile's batch size 8" in result.stderr


def test_a_loader_change_a_generator_cannot_take_is_never_measured(examples_dir: Path) -> None:
    import inspect

    from autotune.runtime.modelfile import load_model_file

    model = examples_dir / "slow_generator.py"
    # The file's loader really is a plain generator: nothing a DataLoader rebuild can reach.
    assert inspect.isgenerator(load_model_file(model).module.build_dataloader(2))
    record = confirm(model, batch_size=8, steps=1, repeats=1, warmup=0, max_changes=2)
    first = record.steps[0]
    assert first.rule == "input_bound" and first.change["dataloader_workers"] == 4
    # Diagnosed input-bound (the rule needs a measured input share >= 0.2: 30 ms of sleep per
    # batch), predicted much faster with workers...
    assert first.predicted.step_time_ratio is not None and first.predicted.step_time_ratio < 0.5
    # ...but a generator cannot have workers: no A/B of two identical plans is reported.
    assert first.status == "not_applicable" and first.measured is None
    assert "generator" in first.why and "DataLoader(dataset" in first.why
    assert "num_workers=4" in first.why
    assert record.final_plan.dataloader_workers == 0
    assert all(step.rule != "input_bound" for step in record.steps[1:])
