"""The policy's CUDA-only rules and actions, and the GPU's memory as the default budget.

Each case runs the same synthetic profile on ``cuda`` and on ``cpu``: the CUDA-only
change must appear on the GPU and never on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _profiles import GB, synthetic_profile

from autotune.policy import suggest
from autotune.records import ProfileRecord, write_record


def _with_capabilities(profile: ProfileRecord, **changes: Any) -> ProfileRecord:
    env = profile.environment
    caps = env.capabilities.model_copy(update=changes)
    return profile.model_copy(update={"environment": env.model_copy(update={"capabilities": caps})})


def _volta(device: str) -> ProfileRecord:
    """fp16 tensor cores, no fast bf16 (compute capability 7.0, bf16 speed not measured)."""
    return _with_capabilities(
        synthetic_profile(device=device, bf16_ratio=None), compute_capability="7.0"
    )


def _flash(device: str) -> ProfileRecord:
    return _with_capabilities(
        synthetic_profile(device=device, precision="bf16", attention="sdpa"),
        flash_attn_available=True,
    )


CASES = [
    # (name, profile for a device, the CUDA-only rule, its change)
    ("fp16_loss_scaling", _volta, "fp16_loss_scaling", {"precision": "amp_fp16"}),
    ("flash_attention", _flash, "flash_attention", {"attention": "flash_attention_2"}),
    ("compile", lambda device: synthetic_profile(device=device, precision="bf16"), "compile",
     {"compile": True}),
    ("pinned_memory", lambda device: synthetic_profile(device=device, dataloader=0.5),
     "input_bound", {"pin_memory": True}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "rule", "change"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_cuda_only_changes_are_proposed_on_a_gpu_and_never_on_a_cpu(
    make: Any, rule: str, change: dict[str, Any]
) -> None:
    on_gpu = {item.rule: item.change for item in suggest(make("cuda")).suggestions}
    assert rule in on_gpu, list(on_gpu)
    assert {key: on_gpu[rule].get(key) for key in change} == change
    on_cpu = suggest(make("cpu")).suggestions
    for item in on_cpu:
        assert all(item.change.get(key) != value for key, value in change.items()), item.rule


def test_a_volta_gpu_is_not_counted_as_fast_bf16_but_an_ampere_one_is() -> None:
    volta = suggest(_volta("cuda")).suggestions
    ampere = suggest(
        _with_capabilities(synthetic_profile(bf16_ratio=None), compute_capability="8.0")
    ).suggestions
    assert volta[0].rule == "fp16_loss_scaling" and volta[0].evidence["fast_bf16"].value is False
    assert ampere[0].rule == "mixed_precision" and ampere[0].change == {"precision": "amp_bf16"}


def test_the_budget_defaults_to_a_profiled_gpus_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.api import tune_model
    from autotune.report import ReportInputs, collect
    from autotune.search import TrialResult
    from autotune.search._runner import FakeRunner

    gpu, cpu = synthetic_profile(), synthetic_profile(device="cpu")
    assert gpu.environment.device_memory_bytes == 80 * GB
    assert suggest(gpu).device_memory_bytes == 80 * GB
    # A CPU profile without --device-memory: the machine's available memory, said so.
    import psutil

    on_cpu = suggest(cpu)
    assert on_cpu.device_memory_bytes == pytest.approx(psutil.virtual_memory().available, rel=0.1)
    assert any("available memory" in note for note in on_cpu.notes)
    assert collect(ReportInputs(profile=gpu)).budget_bytes == 80 * GB
    assert collect(ReportInputs(profile=cpu)).budget_bytes is None

    def ok(plan: Any, settings: Any) -> TrialResult:
        return TrialResult(completed_steps=2, samples_per_s=1.0, step_time=8.0,
                           peak_memory_bytes=[GB], peak_source="fake",
                           device_memory=settings.device_memory)  # fmt: skip

    model = tmp_path / "model.py"
    model.write_text("# never imported: the fake runner does not build it\n")
    # On a CPU the budget is this machine's available memory (as the policy plans for it).
    monkeypatch.setattr("autotune.records._machine.available_memory", lambda: 7 * GB)
    for profile, budget in [(gpu, 80 * GB), (cpu, 7 * GB)]:
        path = write_record(tmp_path / f"{profile.config.device}.json", profile)
        record = tune_model(str(model), global_batch=8, profile_path=str(path),
                            runner=FakeRunner(ok), trials=1, repeats=1,
                            storage=str(tmp_path / f"{profile.config.device}.db"))  # fmt: skip
        assert record.device_memory == budget
