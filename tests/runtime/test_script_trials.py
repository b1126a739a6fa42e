"""Script trials end to end (slow: real launches of the example scripts on CPU): the peak a
script trial measures against a model-file trial's, a script that crashes at step 3, and a
2-rank tune of each example script whose recommended config then trains the unchanged script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from autotune.api import NO_PROFILE, deepspeed_config, tune_script
from autotune.records import Machine, Plan, TuneOptions
from autotune.runtime.trial.entry_points import ENTRY_POINTS
from autotune.runtime.trial.script import HOOK_DIR
from autotune.search import ScriptRunner, SubprocessRunner, TrialResult, TrialSettings

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "scripts"
MICRO_BATCH_FLAG = {"train_micro_batch_size_per_gpu": "--batch-size"}
DS_SCRIPT = [sys.executable, str(SCRIPTS / "deepspeed_train.py"),
             "--deepspeed_config", str(SCRIPTS / "ds_config.json")]  # fmt: skip


@pytest.fixture(autouse=True)
def _cpu_deepspeed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def _options(tmp_path: Path, global_batch: int) -> TuneOptions:
    return TuneOptions(global_batch=global_batch, trials=2, steps=2, warmup=1,
                       interval_width=None, repeats=0, trial_timeout_s=300,
                       storage=str(tmp_path / "study.db"))  # fmt: skip


PEAK_PLAN = Plan(zero_stage=2, micro_batch=2, grad_accum=2, nproc_per_node=2)
PEAK_SETTINGS = TrialSettings(model_file=str(SCRIPTS / "tiny_model.py"), steps=2, warmup=1,
                              device="cpu", timeout_s=300, interval_width=None)  # fmt: skip
PEAK_SCRIPTS = {
    "hf_trainer": ([sys.executable, str(SCRIPTS / "hf_trainer_train.py"), "--output_dir",
                    "{tmp}/hf", "--report_to", "none"], {}),
    "deepspeed": (DS_SCRIPT, MICRO_BATCH_FLAG),
    "accelerate": ([sys.executable, str(SCRIPTS / "accelerate_train.py")], MICRO_BATCH_FLAG),
}  # fmt: skip


@pytest.fixture(scope="module")
def model_file_trial(tmp_path_factory: pytest.TempPathFactory) -> TrialResult:
    """The reference: the model-file worker builds the engine and runs the steps itself."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    runner = SubprocessRunner(entry_points=ENTRY_POINTS, workdir=tmp_path_factory.mktemp("ref"))
    report = runner.run(PEAK_PLAN, PEAK_SETTINGS)
    assert report.result is not None and report.returncode == 0, report.stderr_tail
    return report.result


@pytest.mark.parametrize("case", list(PEAK_SCRIPTS))
def test_script_trial_peak_is_the_model_file_trials(
    case: str, model_file_trial: TrialResult, tmp_path: Path
) -> None:
    """The same model, optimizer and plan: per rank within 2 %."""
    command, arg_map = PEAK_SCRIPTS[case]
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    runner = ScriptRunner(command, hook_dir=HOOK_DIR, arg_map=arg_map,
                          entry_points=ENTRY_POINTS, workdir=tmp_path)  # fmt: skip
    script = runner.run(PEAK_PLAN, PEAK_SETTINGS)
    assert script.result is not None, script.stderr_tail
    assert script.returncode == 0 and script.result.error is None
    for result in (model_file_trial, script.result):
        assert result.peak_source == "cpu_live_tensors" and result.engine == "deepspeed"
        assert len(result.peak_memory_bytes) == 2
    print(f"{case} peaks: model file", model_file_trial.peak_memory_bytes,
          "script", script.result.peak_memory_bytes)  # fmt: skip
    for measured, expected in zip(
        script.result.peak_memory_bytes, model_file_trial.peak_memory_bytes, strict=True
    ):
        assert abs(measured - expected) <= 0.02 * expected
    # The rest of the record a model-file trial writes, measured in the script.
    assert script.result.completed_steps == 3 and len(script.result.step_times) == 2
    split = script.result.split
    assert split is not None and min(split.forward, split.backward) > 0
    assert script.result.tokens_per_s == pytest.approx(script.result.samples_per_s * 64)


def test_a_script_raising_at_step_3_is_a_crash_with_its_line_and_the_study_goes_on(
    tmp_path: Path,
) -> None:
    source = (SCRIPTS / "deepspeed_train.py").read_text(encoding="utf-8").splitlines()
    line = next(i for i, text in enumerate(source, 1) if "raise RuntimeError" in text)
    record = tune_script(
        [*DS_SCRIPT, "--fail-at-step", "3"], options=_options(tmp_path, 4),
        machine=Machine(device="cpu"), arg_map=MICRO_BATCH_FLAG,
    )  # fmt: skip
    ran = [trial for trial in record.trials if trial.outcome is not None]
    assert len(ran) == 2  # the first crash did not end the study
    for trial in ran:
        assert trial.outcome == "crash"
        where = f"{SCRIPTS / 'deepspeed_train.py'}:{line})"
        assert trial.reason == f"RuntimeError: planned failure at step 3 ({where}"
    assert psutil.Process().children(recursive=True) == []  # nothing left running


def _trains(command: list[str], tmp_path: Path) -> dict:
    # the user's own command, run as written: torchrun's log folder goes to the test's TMPDIR
    scratch = tmp_path / "system-tmp"
    scratch.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300,
                          check=False, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]


def _hf_run(plan: Plan, config: Path, tmp_path: Path) -> list[str]:
    # The Trainer takes the plan's arguments (micro-batch, accumulation, precision) as the
    # README shows: hf_training_arguments(plan), here as the script's own flags.
    from autotune import hf_training_arguments

    flags = [word for key, value in hf_training_arguments(plan).items()
             for word in (f"--{key}", str(value))]  # fmt: skip
    return [*TORCHRUN, str(SCRIPTS / "hf_trainer_train.py"), "--output_dir", str(tmp_path / "o"),
            "--report_to", "none", "--use_cpu", "--max_steps", "3", "--logging_steps", "1",
            "--deepspeed", str(config), *flags]  # fmt: skip


def _ds_run(plan: Plan, config: Path, tmp_path: Path) -> list[str]:
    return [*TORCHRUN, str(SCRIPTS / "deepspeed_train.py"), "--deepspeed_config", str(config),
            "--batch-size", str(plan.micro_batch), "--steps", "3"]  # fmt: skip


def _accelerate_run(plan: Plan, config: Path, tmp_path: Path) -> list[str]:
    return [*TORCHRUN, str(SCRIPTS / "accelerate_train.py"), "--deepspeed-config", str(config),
            "--batch-size", str(plan.micro_batch), "--grad-accum", str(plan.grad_accum),
            "--steps", "3"]  # fmt: skip


CASES = {
    "hf_trainer": ([sys.executable, str(SCRIPTS / "hf_trainer_train.py"), "--output_dir",
                    "{tmp}/hf", "--report_to", "none"], {}, _hf_run),
    "deepspeed": (DS_SCRIPT, MICRO_BATCH_FLAG, _ds_run),
    "accelerate": ([*TORCHRUN, str(SCRIPTS / "accelerate_train.py")], MICRO_BATCH_FLAG,
                   _accelerate_run),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_tune_each_script_on_two_ranks_and_its_config_trains_it(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command, arg_map, recommended_run = CASES[case]
    command = [part.replace("{tmp}", str(tmp_path)) for part in command]
    extensions = tmp_path / "extensions"  # where DeepSpeed's first start would build its comm op
    with monkeypatch.context() as env:
        env.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
        record = tune_script(command, options=_options(tmp_path, 8),
                             machine=Machine(device="cpu", nproc_per_node=2), arg_map=arg_map)  # fmt: skip
    assert not extensions.exists() or not any(extensions.iterdir())  # the trials built nothing
    assert NO_PROFILE not in record.notes  # profiled in the script: estimate and policy apply
    assert any(t.predicted_peak_bytes for t in record.trials)
    ok = [t for t in record.trials if t.outcome == "ok"]
    assert ok, [t.reason for t in record.trials]
    for trial in ok:
        assert trial.peak_source == "cpu_live_tensors" and trial.peak_memory_bytes
        assert trial.steps_measured == 2 and trial.samples_per_s
    rec = record.recommendation
    assert rec is not None and rec.plan.world_size == 2 and rec.plan.global_batch == 8
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(deepspeed_config(rec, world_size=2)), encoding="utf-8")
    out = _trains(recommended_run(rec.plan, config, tmp_path), tmp_path)
    assert out["finite"] and len(out["losses"]) == 3


def test_profile_of_a_script_is_the_model_files_profile(tmp_path: Path) -> None:
    """``autotune profile -- COMMAND`` profiles the script's own model and first batch in its
    process; the model file of the same model, profiled the usual way, is the reference."""
    from autotune.api import profile_script
    from autotune.runtime.profiler import profile

    script = profile_script(DS_SCRIPT, batch_size=2, steps=2, warmup=1, device="cpu",
                            arg_map=MICRO_BATCH_FLAG)  # fmt: skip
    reference = profile(SCRIPTS / "tiny_model.py", batch_size=2, steps=2, warmup=1, device="cpu")
    assert script.model.parameters == reference.model.parameters
    assert script.model.block_stack is not None and script.model.block_stack.count == 4
    assert script.model.tokens_per_sample == 64
    assert script.memory.activations == reference.memory.activations
    print("profile peaks: model file", reference.memory.peak, "script", script.memory.peak)
    assert abs(script.memory.peak - reference.memory.peak) <= 0.02 * reference.memory.peak
