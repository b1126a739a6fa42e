"""The policy keeps --global-batch exactly; where it cannot, a note says so and suggest exits 1.

Issue 31: ``--global-batch 5 --device-memory 30MiB`` ended at mb=2, ga=3 (6 samples) and
``--global-batch 3 --nproc-per-node 2`` at mb=4 on 2 ranks (8 samples), both exit 0, no note.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _profiles import GB, synthetic_profile
from typer.testing import CliRunner

from autotune.cli import app
from autotune.policy import SuggestRecord, suggest
from autotune.policy._actions import largest_divisor, per_rank_batch
from autotune.records import Plan, write_record

# A CPU profile at batch 4 with fast bf16, like examples/tiny_llama.py's.
LIKE_TINY_LLAMA: dict[str, Any] = {"device": "cpu", "bf16_ratio": 3.0, "batch_size": 4}
SLOW_BF16_CPU: dict[str, Any] = {"device": "cpu", "bf16_ratio": 0.15}
GPU: dict[str, Any] = {"device": "cuda"}

CASES = [
    # (name, profile knobs, global batch, ranks, device memory in bytes or None)
    ("reported_5_tight_budget", LIKE_TINY_LLAMA, 5, 1, int(2.0 * GB)),
    ("reported_3_over_2_ranks", LIKE_TINY_LLAMA, 3, 2, None),
    ("prime_over_1_rank", SLOW_BF16_CPU, 7, 1, int(2.0 * GB)),
    ("larger_than_micro_batch", SLOW_BF16_CPU, 64, 1, None),
    ("one_sample", SLOW_BF16_CPU, 1, 1, int(1.8 * GB)),
    ("splits_over_4_ranks", SLOW_BF16_CPU, 12, 4, int(1.9 * GB)),
    ("splits_over_2_ranks_tight", LIKE_TINY_LLAMA, 10, 2, int(1.75 * GB)),
    ("splits_over_2_ranks_gpu", GPU, 24, 2, int(1.8 * GB)),
    ("does_not_split_over_4_ranks", SLOW_BF16_CPU, 6, 4, None),
    ("fewer_samples_than_ranks", GPU, 2, 4, int(1.8 * GB)),
    ("odd_over_2_ranks_gpu", GPU, 5, 2, None),
]
IDS = [case[0] for case in CASES]
PARAMS = [case[1:] for case in CASES]


def _samples(plan: Plan) -> int:
    """The plan's global batch, from its fields (not its own ``global_batch``)."""
    return plan.micro_batch * plan.grad_accum * plan.nproc_per_node * plan.nnodes


def _check(record: SuggestRecord, target: int, ranks: int, exit_code: int | None) -> None:
    """Kept exactly (exit 0), or a note names the global batch (exit 1); never silently."""
    final = record.final_plan
    kept = _samples(final) == target
    assert record.global_batch_kept is kept
    notes = [note for note in record.notes if "global batch" in note]
    if kept:
        assert notes == [] and exit_code in (None, 0)
    else:
        assert len(notes) == 1 and exit_code in (None, 1)
        assert f"target {target}" in notes[0] and f"gives {_samples(final)}" in notes[0]
    # It is kept whenever it splits evenly over the ranks, and only then.
    assert kept is (target % ranks == 0)


@pytest.fixture(autouse=True)
def _available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.records._machine.available_memory", lambda: 64 * GB)


@pytest.mark.parametrize(("knobs", "target", "ranks", "memory"), PARAMS, ids=IDS)
def test_suggest_keeps_the_global_batch_or_notes_it(
    knobs: dict[str, Any], target: int, ranks: int, memory: int | None
) -> None:
    record = suggest(
        synthetic_profile(**knobs), global_batch=target, world_size=ranks, device_memory=memory
    )
    _check(record, target, ranks, None)
    # Every plan the policy proposes on the way keeps it where it can, not only the last.
    if target % ranks == 0:
        for item in record.suggestions:
            if {"micro_batch", "grad_accum"} & item.change.keys():
                assert _samples(item.plan) == target, item.rule


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "table"])
@pytest.mark.parametrize(("knobs", "target", "ranks", "memory"), PARAMS, ids=IDS)
def test_cli_exits_1_when_the_global_batch_is_not_kept(
    knobs: dict[str, Any],
    target: int,
    ranks: int,
    memory: int | None,
    json_output: bool,
    tmp_path: Path,
) -> None:
    path = write_record(tmp_path / "profile.json", synthetic_profile(**knobs))
    args = ["suggest", str(path), "--global-batch", str(target), "--nproc-per-node", str(ranks)]
    args += ["--device-memory", f"{memory}B"] if memory else []
    result = CliRunner().invoke(app, [*args, "--json"] if json_output else args)
    assert result.exit_code in (0, 1), result.output
    if json_output:
        record = SuggestRecord.model_validate(json.loads(result.stdout))
        _check(record, target, ranks, result.exit_code)
    else:
        # The table is printed in full before the exit, the note with it.
        assert "final plan:" in result.stdout
        noted = "note: global batch not kept" in result.stdout
        assert noted is (result.exit_code == 1) is (target % ranks != 0)


def test_a_policy_without_keep_global_batch_is_noted(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'extends = "default"\ndisable = ["keep_global_batch", "shrink_micro_batch"]\n'
    )
    profile = synthetic_profile(**SLOW_BF16_CPU)  # micro-batch 8
    record = suggest(profile, global_batch=64, policy_path=policy)
    assert not record.global_batch_kept and _samples(record.final_plan) == 8
    (note,) = [note for note in record.notes if "global batch" in note]
    assert "target 64" in note and "keep_global_batch" in note
    result = CliRunner().invoke(
        app,
        ["suggest", str(write_record(tmp_path / "p.json", profile)), "--global-batch", "64",
         "--policy", str(policy)],
    )  # fmt: skip
    assert result.exit_code == 1, result.output


def test_without_a_target_the_plans_own_global_batch_is_kept() -> None:
    # Shrinking the micro-batch to fit keeps micro-batch x accumulation (8 here): no note.
    record = suggest(synthetic_profile(**SLOW_BF16_CPU), device_memory=int(1.95 * GB),
                     skip_rules=["activation_checkpointing"])  # fmt: skip
    assert record.final_plan.micro_batch < 8
    assert _samples(record.final_plan) == 8 and record.global_batch_kept


def test_bad_input_still_exits_2(tmp_path: Path) -> None:
    path = write_record(tmp_path / "profile.json", synthetic_profile(**SLOW_BF16_CPU))
    result = CliRunner().invoke(app, ["suggest", str(path), "--global-batch", "0"])
    assert result.exit_code == 2
    result = CliRunner().invoke(
        app, ["suggest", str(tmp_path / "none.json"), "--global-batch", "3"]
    )
    assert result.exit_code == 2


@pytest.mark.parametrize(
    ("target", "plan", "per_rank"),
    [
        (None, Plan(micro_batch=4, grad_accum=3), 12),
        (12, Plan(micro_batch=4, nproc_per_node=4), 3),
        (3, Plan(micro_batch=4, nproc_per_node=2), 2),  # 1.5 rounds half up
        (5, Plan(micro_batch=4, nproc_per_node=4), 1),
        (1, Plan(micro_batch=4, nproc_per_node=4), 1),  # at least one per rank
    ],
)
def test_per_rank_batch(target: int | None, plan: Plan, per_rank: int) -> None:
    assert per_rank_batch(target, plan) == per_rank


@pytest.mark.parametrize(
    ("samples", "cap", "micro"), [(5, 4, 1), (6, 4, 3), (12, 4, 4), (7, 8, 7), (8, 0, 1), (2, 8, 2)]
)
def test_largest_divisor(samples: int, cap: int, micro: int) -> None:
    assert largest_divisor(samples, cap) == micro


@pytest.mark.slow
def test_the_reported_commands_on_tiny_llama(examples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tl-profile.json"
    profiled = CliRunner().invoke(app, ["profile", str(examples_dir / "tiny_llama.py"),
                                        "--batch-size", "4", "--steps", "2", "--warmup", "1",
                                        "-o", str(out)])  # fmt: skip
    assert profiled.exit_code == 0, profiled.output
    for options, target, ranks in (
        (["--global-batch", "5", "--device-memory", "30MiB"], 5, 1),
        (["--global-batch", "3", "--nproc-per-node", "2"], 3, 2),
    ):
        result = CliRunner().invoke(app, ["suggest", str(out), *options, "--json"])
        assert result.exit_code in (0, 1), result.output
        _check(SuggestRecord.model_validate(json.loads(result.stdout)), target, ranks,
               result.exit_code)  # fmt: skip
