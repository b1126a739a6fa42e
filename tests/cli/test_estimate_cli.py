"""`autotune estimate` on the command line: records, tables and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _profiles import hand_profile as make_profile
from typer.testing import CliRunner

from autotune.cli import app

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
runner = CliRunner()


@pytest.fixture
def profile_json(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(make_profile().model_dump_json())
    return path


def test_profile_plan_by_default_equals_the_profile(profile_json: Path) -> None:
    result = runner.invoke(app, ["estimate", "--profile", str(profile_json), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["parameters"] == 1_000_000
    (plan,) = record["plans"]
    assert plan["plan"]["micro_batch"] == 4
    assert plan["memory"]["peak"] == make_profile().memory.peak
    assert plan["predicted_step_time_ratio"] == pytest.approx(1.0)
    assert set(plan["memory"]) >= {
        "parameters",
        "gradients",
        "optimizer_states",
        "activations",
        "peak",
    }


def test_plans_table_and_claim_check(profile_json: Path) -> None:
    result = runner.invoke(
        app,
        [
            "estimate",
            "--profile",
            str(profile_json),
            "--plan",
            "mb=8",
            "--plan",
            "mb=2,ga=2,ckpt=4",
            "--device-memory",
            "1GB",
            "--check",
            "stage=3,world_size=8,memory=1MB",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "fp32 mb=8" in result.stdout
    assert "claim check" in result.stdout
    assert "impossible" in result.stdout
    assert "formula, not a measurement" in result.stdout


def test_all_plans_for_several_devices(profile_json: Path) -> None:
    result = runner.invoke(
        app,
        ["estimate", "--profile", str(profile_json), "--all-plans", "--world-size", "4", "--json"],
    )
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert {p["plan"]["zero_stage"] for p in plans} == {0, 1, 2, 3}
    assert all(p["plan"]["gpus_per_node"] == 4 for p in plans)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plan", "stage=9"], "--plan"),
        (["--check", "stage=3"], "memory=SIZE"),
        (["--world-size", "2", "--nodes", "2"], "--world-size"),
        (["--device-memory", "lots"], "--device-memory"),
        (["--seq-len", "128"], "--seq-len"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    profile_json: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["estimate", "--profile", str(profile_json), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_missing_inputs_are_named(tmp_path: Path) -> None:
    result = runner.invoke(app, ["estimate", "--batch-size", "2"])
    assert result.exit_code == 2
    assert "MODEL" in result.stderr
    result = runner.invoke(app, ["estimate", "--profile", str(tmp_path / "none.json")])
    assert result.exit_code == 2
    assert "none.json" in result.stderr


def test_bad_hf_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 8}')
    result = runner.invoke(
        app, ["estimate", "--hf-config", str(config), "--seq-len", "8", "-b", "1"]
    )
    assert result.exit_code == 2
    assert "config.json" in result.stderr and "model_type" in result.stderr


@pytest.mark.slow
def test_llama_7b_config_on_four_devices() -> None:
    result = runner.invoke(
        app,
        [
            "estimate",
            "--hf-config",
            str(CONFIGS / "llama2_7b.json"),
            "--seq-len",
            "4096",
            "-b",
            "1",
            "--world-size",
            "4",
            "--plan",
            "precision=bf16,stage=2",
            "--check",
            "precision=bf16,stage=2,world_size=4,memory=17.2GB",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["parameters"] == 6_738_415_616
    memory = record["plans"][0]["memory"]
    # DeepSpeed accounting, stage 2: (2 + 18/N) psi
    states = memory["parameters"] + memory["gradients"] + memory["optimizer_states"]
    assert states == pytest.approx((2 + 18 / 4) * 6_738_415_616, rel=1e-6)
    assert record["check"]["possible"] is False
    assert record["check"]["floor_bytes"] / 1e9 == pytest.approx(37.06, abs=0.01)


def test_repeated_profiles_refine_the_time(profile_json: Path, tmp_path: Path) -> None:
    half = tmp_path / "half.json"
    record = make_profile(batch=2)
    half.write_text(
        record.model_copy(
            update={"time": record.time.model_copy(update={"forward": 0.2})}
        ).model_dump_json()
    )
    result = runner.invoke(
        app,
        [
            "estimate",
            "--profile",
            str(profile_json),
            "--profile",
            str(half),
            "--plan",
            "mb=8",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    single = runner.invoke(
        app, ["estimate", "--profile", str(profile_json), "--plan", "mb=8", "--json"]
    )
    refined = json.loads(result.stdout)["plans"][0]["predicted_step_time_ratio"]
    assert refined < json.loads(single.stdout)["plans"][0]["predicted_step_time_ratio"]
    bad = runner.invoke(
        app, ["estimate", "--profile", str(profile_json), "--profile", str(profile_json)]
    )
    assert bad.exit_code == 2
    assert "--profile" in bad.stderr


TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}
ENTRY = (
    "import sys\nsys.argv = ['autotune', *sys.argv[1:]]\nfrom autotune.cli import main\nmain()\n"
)
BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n" + ENTRY
)


@pytest.mark.slow
def test_a_traced_config_answers_again_without_torch(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_LLAMA))
    args = ["estimate", "--hf-config", str(config), "--seq-len", "32", "-b", "2", "--json"]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "AUTOTUNE_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # fmt: skip

    def run(code: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *code, *args], capture_output=True, text=True,
                              env=env, timeout=300)  # fmt: skip

    first = run(["-c", ENTRY])
    assert first.returncode == 0, first.stderr[-2000:]
    again = run(["-c", BLOCK_TORCH])  # torch and transformers cannot be imported
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout) == json.loads(first.stdout)
    # Another config is traced anew (and here, without torch, cannot be).
    config.write_text(json.dumps({**TINY_LLAMA, "hidden_size": 128}))
    assert run(["-c", BLOCK_TORCH]).returncode != 0
