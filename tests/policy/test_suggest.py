"""suggest: synthetic profiles, one per situation, give the expected ordered suggestions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _profiles import GB, synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.policy import policy_plan, suggest
from autotune.records import AutotuneError, write_record

SLOW_BF16_CPU: dict[str, Any] = {"device": "cpu", "bf16_ratio": 0.15}
# Offload moves states to the host: only a GPU has a host apart from its device memory.
SLOW_BF16_GPU: dict[str, Any] = {"device": "cuda", "bf16_ratio": 0.15}
BIG = {"parameters": 20_000_000_000, "activations_per_sample": 0.5 * GB, "layers": 48}

CASES = [
    # (name, profile knobs, suggest options, expected first rule, expected change of it)
    (
        "input_bound",
        {"dataloader": 0.5},
        {},
        "input_bound",
        {"dataloader_workers": 4, "pin_memory": True},
    ),
    (
        "input_bound_before_memory",
        {**SLOW_BF16_CPU, "dataloader": 0.4, "activations_per_sample": 20 * GB},
        {"device_memory": 80 * GB},
        "input_bound",
        {"dataloader_workers": 4},
    ),
    ("fast_bf16_gpu", {}, {}, "mixed_precision", {"precision": "amp_bf16"}),
    (
        "activations_dominate",
        {**SLOW_BF16_CPU, "activations_per_sample": 20 * GB},
        {"device_memory": 80 * GB},
        "activation_checkpointing",
        None,
    ),
    (
        # No budget on a CPU: the machine's available memory (64 GB here); the step fits, and
        # recomputation alone only costs time, so nothing is checkpointed.
        "activations_dominate_cpu_fits",
        {**SLOW_BF16_CPU, "activations_per_sample": 2 * GB},
        {},
        None,
        None,
    ),
    (
        "cpu_over_available_memory",
        {**SLOW_BF16_CPU, "activations_per_sample": 2 * GB},
        {"available": 10 * GB},
        "activation_checkpointing",
        None,
    ),
    (
        "model_states_one_device",
        {**SLOW_BF16_GPU, **BIG},
        # the lossless-speed rules a GPU gets first are not what this case is about
        {
            "device_memory": 80 * GB,
            "skip_rules": ["fp16_loss_scaling", "compile", "sdpa_attention"],
        },
        "offload_optimizer",
        {"offload_optimizer": "cpu", "zero_stage": 2},
    ),
    (
        "model_states_several_devices",
        {**SLOW_BF16_CPU, "parameters": 7_000_000_000},
        {"device_memory": 80 * GB, "world_size": 8},
        "zero_1",
        {"zero_stage": 1},
    ),
    (
        "slow_inter_node_link",
        {**SLOW_BF16_CPU, **BIG},
        {"device_memory": 80 * GB, "world_size": 16, "nproc_per_node": 8, "inter_gbps": 25},
        "zero_1",
        None,
    ),
    ("global_batch", SLOW_BF16_CPU, {"global_batch": 64}, "keep_global_batch", {"grad_accum": 8}),
    (
        "eager_attention_of_a_transformer",
        {**SLOW_BF16_CPU, "attention": "eager"},
        {},
        "sdpa_attention",
        {"attention": "sdpa"},
    ),
    ("already_optimal", SLOW_BF16_CPU, {"device_memory": 80 * GB}, None, None),
]


@pytest.mark.parametrize(
    ("profile_knobs", "options", "rule", "change"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_first_suggestion(
    profile_knobs: dict[str, Any],
    options: dict[str, Any],
    rule: str | None,
    change: dict[str, Any] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = dict(options)
    available = options.pop("available", 64 * GB)
    monkeypatch.setattr("autotune.records._machine.available_memory", lambda: available)
    record = suggest(synthetic_profile(**profile_knobs), **options)
    if rule is None:
        assert record.suggestions == []
        assert record.final_plan == record.baseline
        return
    first = record.suggestions[0]
    assert first.rule == rule
    if change is not None:
        assert {key: first.change[key] for key in change} == change
    assert first.evidence, "every suggestion names the facts that triggered it"
    assert first.reason


def test_checkpointing_picks_the_fewest_blocks_that_fit() -> None:
    record = suggest(
        synthetic_profile(**SLOW_BF16_CPU, activations_per_sample=20 * GB), device_memory=80 * GB
    )
    first = record.suggestions[0]
    blocks = first.change["checkpoint_blocks"]
    assert 0 < blocks < 12
    assert first.predicted.fits_after is True
    assert first.predicted.peak_bytes_after < first.predicted.peak_bytes_before
    one_fewer = suggest(
        synthetic_profile(**SLOW_BF16_CPU, activations_per_sample=20 * GB),
        device_memory=80 * GB,
        start=record.baseline.with_changes(checkpoint_blocks=blocks - 1),
        skip_rules={"activation_checkpointing"},
    )
    assert one_fewer.suggestions, (
        "one block fewer must still not fit, so something else is proposed"
    )


@pytest.mark.parametrize(
    ("gbps", "third_before_fourth"),
    [(25, ("zero_3_slow_link", "offload_optimizer")), (400, ("zero_3", "offload_optimizer"))],
)
def test_zero3_comes_after_zero2_and_offload_after_zero3_on_any_link(
    gbps: float, third_before_fourth: tuple[str, str]
) -> None:
    options = {"device_memory": 80 * GB, "world_size": 16, "nproc_per_node": 8, "inter_gbps": gbps}
    profile = synthetic_profile(**SLOW_BF16_GPU, parameters=70_000_000_000, layers=80)
    rules = [item.rule for item in suggest(profile, **options).suggestions]
    assert rules.index("zero_1") < rules.index("zero_2")
    first, second = third_before_fourth
    assert rules.index("zero_2") < rules.index(first)
    if second in rules:
        assert rules.index(first) < rules.index(second)


def test_suggestions_stack_and_policy_plan_is_the_last() -> None:
    profile = synthetic_profile(dataloader=0.5, parameters=7_000_000_000)
    record = suggest(profile, world_size=8)
    plan = record.baseline
    for item in record.suggestions:
        assert item.plan == plan.with_changes(**item.change)
        plan = item.plan
    assert policy_plan(profile, world_size=8) == plan == record.final_plan


def test_evidence_labels_measured_numbers() -> None:
    first = suggest(synthetic_profile(dataloader=0.5)).suggestions[0]
    assert first.evidence["input_share"].value == pytest.approx(0.5)
    assert first.evidence["input_share"].source == "measured"
    assert first.predicted.time_source == "formula"
    assert first.predicted.step_time_ratio == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"world_size": 8, "nproc_per_node": 3}, "--gpus-per-node"),
        ({"world_size": 0}, "--world-size"),
        ({"inter_gbps": -1.0}, "--inter-gbps"),
        ({"global_batch": 0}, "--global-batch"),
    ],
)
def test_bad_options_name_the_flag(options: dict[str, Any], flag: str) -> None:
    with pytest.raises(AutotuneError, match=flag):
        suggest(synthetic_profile(), **options)


def test_cli_json_has_suggestions_in_order(tmp_path: Path) -> None:
    path = write_record(
        tmp_path / "p.json", synthetic_profile(dataloader=0.5, parameters=7_000_000_000)
    )
    result = CliRunner().invoke(app, ["suggest", str(path), "--nproc-per-node", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    rules = [item["rule"] for item in data["suggestions"]]
    assert rules[0] == "input_bound" and "zero_1" in rules
    assert {"rule", "change", "evidence", "predicted"} <= set(data["suggestions"][0])


def test_cli_table_and_errors(tmp_path: Path) -> None:
    path = write_record(tmp_path / "p.json", synthetic_profile(dataloader=0.5))
    result = CliRunner().invoke(app, ["suggest", str(path)])
    assert result.exit_code == 0 and "next change: input_bound" in result.stdout
    missing = CliRunner().invoke(app, ["suggest", str(tmp_path / "absent.json")])
    assert missing.exit_code == 2 and "no such profile file" in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[rule]]\nid = "x"\norder = 1\nall = [["nope", "==", 1]]\naction = "compile"\nreason = "r"\n'
    )
    rejected = CliRunner().invoke(app, ["suggest", str(path), "--policy", str(bad)])
    assert rejected.exit_code == 2 and "unknown fact 'nope'" in rejected.stderr


def test_a_policys_own_words_are_printed_as_written(tmp_path: Path) -> None:
    """A rule's reason with brackets (a user's policy file) is shown verbatim: Rich would read
    "[/x]" as a closing tag and fail, and drop "[data]" as a style."""
    from autotune import policy

    path = write_record(tmp_path / "p.json", synthetic_profile(dataloader=0.5))
    default = (Path(policy.__file__).parent / "default.toml").read_text()
    said = "The step waits for data [see runbook/x], [/x] then [bold]workers[/bold]."
    mine = tmp_path / "mine.toml"
    mine.write_text(default.replace(
        'reason = "The step waits for data: more DataLoader workers (and pinned memory, prefetch) '
        'before any other change."', f"reason = {json.dumps(said)}"))  # fmt: skip
    assert said in mine.read_text()
    result = CliRunner().invoke(app, ["suggest", str(path), "--policy", str(mine)])
    assert result.exit_code == 0, result.output
    assert f"  why: {said}" in result.stdout


def test_suggest_runs_with_torch_unimportable(tmp_path: Path) -> None:
    path = write_record(tmp_path / "p.json", synthetic_profile(dataloader=0.5))
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['deepspeed'] = None\n"
        "sys.argv = ['autotune', 'suggest', sys.argv[1], '--json']\n"
        "from autotune.cli import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "assert sys.modules['torch'] is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["suggestions"][0]["rule"] == "input_bound"


@pytest.mark.parametrize("world_size", [1, 16])
def test_offload_is_never_proposed_on_a_cpu_device(world_size: int) -> None:
    # Host and device memory are one memory there: offloading frees nothing.
    profile = synthetic_profile(**SLOW_BF16_CPU, parameters=70_000_000_000, layers=80)
    record = suggest(profile, device_memory=80 * GB, world_size=world_size)
    if world_size > 1:
        assert record.suggestions[0].rule == "zero_1"
    assert record.final_plan.offload_optimizer == record.final_plan.offload_param == "none"
    assert not any(item.rule.startswith("offload") for item in record.suggestions)


@pytest.mark.parametrize("framework", ["torch", "accelerate", "deepspeed", None])
def test_a_zero_stage_names_its_fsdp2_alternative_for_torch_and_accelerate(
    framework: str | None,
) -> None:
    from autotune.records import parse_plan

    profile = synthetic_profile(**SLOW_BF16_CPU, parameters=70_000_000_000, layers=80)
    record = suggest(profile, device_memory=80 * GB, world_size=16, framework=framework)
    staged = [item for item in record.suggestions if "zero_stage" in item.change]
    assert staged
    for item in staged:
        if framework in ("torch", "accelerate"):
            assert item.fsdp2_alternative is not None
            alternative = parse_plan(item.fsdp2_alternative)
            assert alternative.engine == "fsdp2"
            assert alternative.zero_stage == max(item.plan.zero_stage, 2)
            assert alternative.micro_batch == item.plan.micro_batch
        else:
            assert item.fsdp2_alternative is None


def test_suggest_cli_prints_the_fsdp2_alternative(tmp_path: Path) -> None:
    profile = synthetic_profile(**SLOW_BF16_CPU, parameters=70_000_000_000, layers=80)
    path = write_record(tmp_path / "profile.json", profile)
    args = ["suggest", str(path), "--device-memory", "80GB", "--nproc-per-node", "16"]
    result = CliRunner().invoke(app, [*args, "--framework", "torch"])
    assert result.exit_code == 0, result.output
    assert "or with PyTorch's FSDP2: " in result.stdout and "engine=fsdp2" in result.stdout
    bad = CliRunner().invoke(app, [*args, "--framework", "jax"])
    assert bad.exit_code == 2 and "--framework: 'jax'" in bad.output
