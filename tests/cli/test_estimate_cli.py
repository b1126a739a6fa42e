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
            "stage=3,nproc_per_node=8,memory=1MB",
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
        [
            "estimate",
            "--profile",
            str(profile_json),
            "--all-plans",
            "--nproc-per-node",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["plans"]
    assert {p["plan"]["zero_stage"] for p in plans} == {0, 1, 2, 3}
    assert all(p["plan"]["nproc_per_node"] == 4 for p in plans)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--plan", "stage=9"], "--plan"),
        (["--check", "stage=3"], "memory=SIZE"),
        (["--world-size", "2"], "--world-size: renamed"),
        (["--device-memory", "lots"], "--device-memory"),
        (["--seq-len", "128"], "--seq-len"),
        (["--check", "tokens_per_s=fast"], "tokens_per_s=fast"),
        (["--check", "tflops=-3"], "tflops=-3"),
        (["--check", "tflops=100,device=B200"], "B200"),
        (["--check", "ckpt=some,tflops=100"], "--check"),
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
            "--nproc-per-node",
            "4",
            "--plan",
            "precision=bf16,stage=2",
            "--check",
            "precision=bf16,stage=2,nproc_per_node=4,memory=17.2GB",
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
    (check,) = record["checks"]
    assert check["possible"] is False
    assert check["memory"]["floor_bytes"] / 1e9 == pytest.approx(37.06, abs=0.01)


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


def test_train_days_from_the_measured_throughput(profile_json: Path) -> None:
    result = runner.invoke(
        app, ["estimate", "--profile", str(profile_json), "--train-tokens", "1M", "--json"]
    )
    assert result.exit_code == 0, result.output
    (plan,) = json.loads(result.stdout)["plans"]
    # The profiled plan itself: the profile's 512 tokens/s, by hand.
    assert plan["train_days"] == pytest.approx(1e6 / 512 / 86_400, rel=1e-9)


@pytest.mark.slow
def test_train_days_from_an_assumed_mfu_on_llama_7b() -> None:
    args = ["estimate", "--hf-config", str(CONFIGS / "llama2_7b.json"), "--seq-len", "4096",
            "-b", "1", "--nproc-per-node", "8", "--plan", "stage=2,precision=bf16",
            "--train-tokens", "300B", "--mfu", "0.4", "--peak-tflops", "312", "--json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (plan,) = json.loads(result.stdout)["plans"]
    # By hand from the config: per layer 4 x 4096^2 (attention) + 3 x 4096 x 11008 (MLP)
    # + 2 x 4096 (norms); 32 layers, a final norm and the untied 32000 x 4096 head; the
    # input embedding does no matmul. 12 x L x h x s for attention at s = 4096.
    layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    non_embedding = 32 * layer + 4096 + 32000 * 4096
    per_token = 6 * non_embedding + 12 * 32 * 4096 * 4096
    days = 300e9 * per_token / (0.4 * 312e12 * 8) / 86_400
    assert plan["train_days"] == pytest.approx(days, rel=1e-6)


@pytest.mark.slow
def test_seed_throughput_rows_against_hand_counted_flops() -> None:
    config = json.loads((CONFIGS / "llama2_7b.json").read_text())
    h, f, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    block = 4 * h * h + 3 * h * f + 2 * h
    non_embedding = config["vocab_size"] * h + layers * block + h  # head, blocks, final norm
    per_token = 6 * non_embedding + 12 * layers * h * 4096
    recomputed = per_token + layers * (2 * block + 4 * h * 4096)
    rows = ["tokens_per_s=1240,tflops=112.5,device=A100",
            "ckpt=all,tokens_per_s=2150,tflops=185.2,device=A100"]  # fmt: skip
    args = ["estimate", "--hf-config", str(CONFIGS / "llama2_7b.json"), "--seq-len", "4096"]
    args += ["-b", "2", "--autocast", "bf16"] + [arg for row in rows for arg in ("--check", row)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    first, second = (check["throughput"] for check in json.loads(result.stdout)["checks"])
    assert first["model_flops_per_token"] == per_token
    assert first["implied_model_tflops"] == pytest.approx(1240 * per_token / 1e12)  # ~57.1
    assert second["recomputed_blocks"] == layers
    assert second["implied_hardware_tflops"] == pytest.approx(2150 * recomputed / 1e12)  # ~131.6
    assert [c["consistent"] for c in (first, second)] == [False, False]
    assert [c["under_peak"] for c in (first, second)] == [True, True]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert f"{112.5 / (1240 * per_token / 1e12):.2f}x" in text.stdout  # 1.97x
    assert f"{185.2 / (2150 * recomputed / 1e12):.2f}x" in text.stdout  # 1.41x
    assert "312 TFLOPS" in text.stdout and "under the peak" in text.stdout


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
    # a budget given: the default (this machine's available memory) moves between the two runs
    args = ["estimate", "--hf-config", str(config), "--seq-len", "32", "-b", "2", "--json",
            "--device-memory", "1GiB", "--host-memory", "1GiB"]  # fmt: skip
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


def test_plan_ckpt_all_is_every_block_of_the_model(profile_json: Path) -> None:
    """``--plan ckpt=all`` reads as ``--check ckpt=all`` does: every one of the L blocks."""
    from _profiles import HAND_L

    # a budget given: the default (this machine's available memory) moves between the two runs
    args = ["estimate", "--profile", str(profile_json), "--json", "--device-memory", "1GiB",
            "--host-memory", "1GiB"]  # fmt: skip
    every = runner.invoke(app, [*args, "--plan", "ckpt=all,mb=2"])
    counted = runner.invoke(app, [*args, "--plan", f"ckpt={HAND_L},mb=2"])
    assert every.exit_code == 0 and counted.exit_code == 0, every.output
    (row,) = json.loads(every.stdout)["plans"]
    assert row["plan"]["checkpoint_blocks"] == HAND_L
    assert json.loads(every.stdout) == json.loads(counted.stdout)


@pytest.mark.parametrize(
    ("plan", "line"),
    [
        ("ckpt=9", "autotune: --plan: ckpt=9: more blocks than the model's L=4"),
        ("mb=2,checkpoint_blocks=5", "autotune: --plan: ckpt=5: more blocks than the model's L=4"),
        ("stage", "autotune: --plan: stage: give a value, e.g. stage=2"),
        ("mb=4,mb=8", "autotune: --plan: micro_batch given twice (mb=4, mb=8)"),
    ],
)
def test_a_plan_the_model_cannot_take_is_refused(profile_json: Path, plan: str, line: str) -> None:
    """The hand profile's model has 4 blocks: more checkpointed blocks than that is no plan."""
    result = runner.invoke(app, ["estimate", "--profile", str(profile_json), "--plan", plan])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [line] and result.stdout == ""


def test_a_check_row_reads_its_knobs_with_the_plan_grammar() -> None:
    """``--check`` rows: ``ckpt=all`` waits for L and resolves to it; the rest as ``--plan``."""
    from autotune.cli._check import read_check
    from autotune.records import AutotuneError, parse_plan

    claim = read_check("ckpt=all,stage=2,memory=3GB").claim(parse_plan("mb=2"), 32, None)
    assert (claim.plan.checkpoint_blocks, claim.plan.zero_stage, claim.plan.micro_batch) == (
        32,
        2,
        2,
    )
    for row, message in [
        ("stage,memory=3GB", "--check: stage: give a value, e.g. stage=2"),
        ("mb=2,mb=4,memory=3GB", "--check: micro_batch given twice (mb=2, mb=4)"),
        ("memory=3GB,memory=4GB", "--check 'memory=3GB,memory=4GB': memory given twice"),
    ]:
        with pytest.raises(AutotuneError) as caught:
            read_check(row)
        assert str(caught.value) == message
    with pytest.raises(AutotuneError, match=r"^--check: ckpt=9: more blocks than the model's L=4$"):
        read_check("ckpt=9,memory=3GB").claim(parse_plan(""), 4, None)


def _link_record(costs: list[dict[str, object]]) -> dict[str, object]:
    """A 2-rank link of 1 ms a call (bandwidth far above this model's bytes), as a tune keeps it."""
    points = [{"collective": c, "nbytes": size, "seconds": 1e-3, "low": 1e-3, "high": 1e-3,
               "repeats": 1} for c in ("all_reduce", "all_gather", "reduce_scatter")
              for size in (2**16, 2**20)]  # fmt: skip
    return {"world_size": 2, "backend": "gloo", "latency_s": 1e-3, "bandwidth_bytes_per_s": 1e15,
            "points": points, "engine_costs": costs}  # fmt: skip


def test_a_tunes_link_times_the_engines_own_work(tmp_path: Path) -> None:
    """--link: the link and engine costs a tune measured; the estimate counts them as tune does."""
    record = make_profile()
    record = record.model_copy(
        update={"model": record.model.model_copy(update={"parameter_sizes": [250_000] * 4})}
    )
    profile = tmp_path / "profile.json"
    profile.write_text(record.model_dump_json())
    # 2 ms a micro-batch + 0.5 ms a tensor, 10 ms a step: 4 tensors, ga=2: 2 x 4 + 10 = 18 ms
    cost = {"engine": "deepspeed-3-fp32", "micro_fixed_s": 2e-3, "micro_per_tensor_s": 5e-4,
            "step_fixed_s": 1e-2, "step_per_tensor_s": 0.0, "blocks": [4, 16],
            "per_block": [1, 1], "steps": 4}  # fmt: skip
    tune = tmp_path / "autotune-tune.json"
    tune.write_text(json.dumps({"study": "s", "link": _link_record([cost])}))
    bare = tmp_path / "link.json"
    bare.write_text(json.dumps(_link_record([])))
    seconds = {}
    for name, link in (("tune", tune), ("bare", bare)):
        result = runner.invoke(app, ["estimate", "--profile", str(profile), "--nproc-per-node",
                                     "2", "--plan", "stage=3,mb=2,ga=2", "--json",
                                     "--link", str(link)])  # fmt: skip
        assert result.exit_code == 0, result.output
        (plan,) = json.loads(result.stdout)["plans"]
        seconds[name] = plan["predicted_step_seconds"]
        notes = " ".join(plan["notes"])
        assert "communication timed on the measured link sweep (2 ranks, gloo" in notes
    assert seconds["tune"] == pytest.approx(seconds["bare"] + 0.018)
    # suggest reads the same option: its last step's predicted seconds grow by the engine's
    # own work and the link's calls, which it did not count without them
    after = {}
    for name, extra in (("tune", ["--link", str(tune)]), ("none", [])):
        result = runner.invoke(app, ["suggest", str(profile), "--nproc-per-node", "2", "--json",
                                     *extra])  # fmt: skip
        assert result.exit_code in (0, 1), result.output
        after[name] = json.loads(result.stdout)["suggestions"][-1]["predicted"]
    assert after["tune"]["step_seconds_after"] > after["none"]["step_seconds_after"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"study": "s", "link": null}', "holds no link"),
        ('{"plan": {}}', "neither a tune record"),
        ("[1, 2]", "neither a tune record"),
        ('{"link": {"world_size": 2, "points": []}}', "not a valid link: field"),
        ("{", "not valid JSON"),
    ],
)
def test_a_bad_link_file_is_one_line_and_exit_2(
    profile_json: Path, tmp_path: Path, content: str, message: str
) -> None:
    link = tmp_path / "link.json"
    link.write_text(content)
    result = runner.invoke(app, ["estimate", "--profile", str(profile_json), "--link", str(link)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "link.json" in result.stderr
    assert "Traceback" not in result.output
