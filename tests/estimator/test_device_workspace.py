"""cuBLAS's workspace on a GPU plan: held by every real step's allocator peak from its first
matmul on, in no tensor. The model-file road (a trace, which allocates none) adds it once to
every plan; a GPU profile's measured peak holds it already, so the profiled road keeps its
measured figure and carries the same bytes, once, into every other plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import compose
from autotune.cli import app
from autotune.estimator import assumed_cublas_workspace, estimate_plan, facts_from_profile
from autotune.records import AtPeak, AutotuneError, Plan, ProfileRecord

MiB = 2**20
PLANS = [
    Plan(micro_batch=2), Plan(micro_batch=4, checkpoint_blocks=4),
    Plan(micro_batch=1, grad_accum=4, zero_stage=1, nproc_per_node=2),
    Plan(precision="bf16", micro_batch=2, zero_stage=2, nproc_per_node=2),
    Plan(micro_batch=2, zero_stage=3, nproc_per_node=2, checkpoint_blocks=2),
    Plan(precision="amp_bf16", micro_batch=8),
    Plan(engine="fsdp2", zero_stage=3, micro_batch=2, nproc_per_node=2),
]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, 2 * 32 * MiB),  # torch's ":4096:8" on compute capability 9.x-12.x, two handles
        (":4096:2:16:8", 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)),  # the older GPUs' default
        (":16:8", 2 * 16 * 1024 * 8),  # the deterministic setting torch documents
    ],
)
def test_the_assumed_workspace_reads_cublas_workspace_config(
    config: str | None, expected: int
) -> None:
    held, source = assumed_cublas_workspace(config)
    assert held == expected
    assert source.startswith("assumed")


@pytest.mark.parametrize("config", ["4096:8", ":4096", "big", ":4096:8 extra"])
def test_a_bad_cublas_workspace_config_is_named(config: str) -> None:
    with pytest.raises(AutotuneError, match="CUBLAS_WORKSPACE_CONFIG"):
        assumed_cublas_workspace(config)


def test_the_model_file_road_adds_the_workspace_once_to_every_gpu_plan(
    examples_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    facts = compose.model_file_facts(examples_dir / "tiny_llama.py", ("fp32", "bf16"), "cuda")
    assert facts.device_workspace == 64 * MiB  # no GPU on this machine: assumed
    assert "assumed" in (facts.device_workspace_source or "")
    bare = facts.model_copy(update={"device_workspace": 0})
    for plan in PLANS:
        held, tensors = estimate_plan(facts, plan), estimate_plan(bare, plan)
        assert held.memory.peak - tensors.memory.peak == 64 * MiB, plan.describe()
        assert "cuBLAS workspace" in held.memory.peak_composition


def test_a_cpu_plan_holds_no_workspace(examples_dir: Path) -> None:
    facts = compose.model_file_facts(examples_dir / "tiny_llama.py", ("fp32",), "cpu")
    assert facts.device_workspace == 0


def test_a_gpu_profile_keeps_its_measured_peak_and_carries_the_workspace_once(
    examples_dir: Path,
) -> None:
    """A CPU profile stands for the tensors; the same record with a workspace W in its allocator
    peak (as a GPU profile measures it: W in the peak and in the temporaries at both recorded
    moments) must answer every other plan with the CPU record's figure plus W."""
    record = compose.profile_model(examples_dir / "tiny_llama.py", batch_size=2, steps=1,
                                   warmup=1, device="cpu")  # fmt: skip
    held = 64 * MiB
    memory = record.memory

    def plus(at: AtPeak) -> AtPeak:
        return at.model_copy(update={"temporaries": at.temporaries + held})

    gpu = record.model_copy(update={
        "memory": memory.model_copy(update={
            "peak": memory.peak + held, "at_peak": plus(memory.at_peak),
            "backward_at_peak": None if memory.backward_at_peak is None
            else plus(memory.backward_at_peak),
        }),
        "environment": record.environment.model_copy(update={"blas_workspace_bytes": held}),
    })  # fmt: skip
    gpu = ProfileRecord.model_validate(json.loads(gpu.model_dump_json()))  # as read from a file
    tensors, with_workspace = facts_from_profile(record), facts_from_profile(gpu)
    assert with_workspace.device_workspace == held
    profiled = Plan(micro_batch=2)
    assert estimate_plan(with_workspace, profiled).memory.peak == memory.peak + held
    for plan in PLANS[1:]:
        expected = estimate_plan(tensors, plan).memory.peak + held
        assert estimate_plan(with_workspace, plan).memory.peak == expected, plan.describe()


def _cuda_peak(model: Path, config: str) -> int:
    result = CliRunner().invoke(
        app, ["estimate", str(model), "-b", "2", "--device", "cuda", "--plan", "mb=2", "--json"],
        env={"CUBLAS_WORKSPACE_CONFIG": config},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return int(json.loads(result.stdout)["plans"][0]["memory"]["peak"])


def test_estimate_for_a_gpu_elsewhere_follows_cublas_workspace_config(
    examples_dir: Path,
) -> None:
    model = examples_dir / "tiny_llama.py"
    difference = _cuda_peak(model, ":4096:8") - _cuda_peak(model, ":16:8")
    assert difference == 2 * (4096 * 1024 * 8 - 16 * 1024 * 8)


def test_a_bad_cublas_workspace_config_exits_2_naming_it(examples_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["estimate", str(examples_dir / "tiny_llama.py"), "-b", "2", "--device", "cuda"],
        env={"CUBLAS_WORKSPACE_CONFIG": "lots"},
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "autotune: CUBLAS_WORKSPACE_CONFIG 'lots': not ':KiB:COUNT' pairs (e.g. ':4096:8')"
    ]
