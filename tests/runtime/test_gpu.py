"""CUDA-only paths on a real GPU: the allocator peak, NVML, the peak table, capabilities, trials in
every precision, a real out-of-memory (skipped without a GPU; tests/runtime/test_cuda_paths.py
runs the same branches on the CPU with the driver stubbed)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_nvml_samples_utilisation_and_memory_while_the_gpu_works() -> None:
    import torch

    from autotune.runtime._device import NvmlSampler

    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)
    with NvmlSampler(device, interval=0.01) as sampler:
        for _ in range(200):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    sample = sampler.result()
    assert sample is not None, sampler.reason
    assert sample.samples >= 2
    assert sample.memory_used_bytes >= a.numel() * a.element_size()
    assert 0 <= sample.gpu_utilization_percent <= 100


def _copy_rate(source: Any, target: Any, repeats: int = 10) -> float:
    """Bytes per second ``target.copy_(source)`` moves (the best of ``repeats``, CUDA events)."""
    import torch

    target.copy_(source, non_blocking=True)
    best = math.inf
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return source.numel() * source.element_size() / best


def test_nvml_links_bound_the_copies_torch_measures() -> None:
    """The memory bandwidth and PCIe link NVML reads against copies timed on the GPU: a
    device-to-device copy reads and writes every byte (2x its size), a pinned host-to-device copy
    crosses the link once; each reaches a fair share of its bound and never beats it."""
    import torch

    from autotune.runtime._device import nvml_links

    device = torch.device("cuda")
    links = nvml_links(device)
    assert links.memory_bytes_per_s is not None and links.pcie_gbps is not None, links.reason
    big = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    memory = 2 * _copy_rate(big, torch.empty_like(big))
    assert 0.5 * links.memory_bytes_per_s < memory <= 1.05 * links.memory_bytes_per_s
    host = torch.empty(1 << 28, dtype=torch.uint8, pin_memory=True)
    pcie_gbps = _copy_rate(host, big[: host.numel()]) * 8 / 1e9
    assert 0.25 * links.pcie_gbps < pcie_gbps <= 1.05 * links.pcie_gbps


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_peak_flops_come_from_the_table_and_bound_a_measured_matmul(dtype: str) -> None:
    import torch

    from autotune.runtime._device import matmul_flops, peak_flops

    device = torch.device("cuda")
    value, source, reason = peak_flops(device, dtype)
    if value is None:
        pytest.skip(f"GPU not in the peak table: {reason}")
    assert source == "table"
    measured = matmul_flops(device, torch.bfloat16 if dtype == "bf16" else torch.float16)
    assert 0.1 * value < measured <= 1.05 * value  # a real matmul reaches a fair share, never more


def test_capabilities_report_compute_capability_and_fast_bf16() -> None:
    import torch

    from autotune.runtime._device import device_capabilities

    caps = device_capabilities(torch.device("cuda"))
    major, minor = torch.cuda.get_device_capability()
    assert caps.compute_capability == f"{major}.{minor}"
    assert caps.fp16_supported
    if major >= 8:  # Ampere and newer: bf16 tensor cores beat fp32
        assert caps.bf16_supported and caps.bf16_fp32_speed_ratio is not None
        assert caps.bf16_fp32_speed_ratio > 1


def test_flash_attn_detection_matches_a_real_import() -> None:
    from autotune.runtime._device import flash_attn_available

    try:
        import flash_attn  # noqa: F401

        imported = True
    except Exception:
        imported = False
    assert flash_attn_available() is imported


def test_allocator_peak_and_reserved_bound_a_known_tensor() -> None:
    import torch

    from autotune.runtime import _device as dev

    device = torch.device("cuda")
    dev.reset_peak_memory(device)
    tensor = torch.ones(64 << 20, device=device)  # 256 MiB
    peaks = dev.allocator_peak(device)
    assert peaks is not None
    allocated, reserved = peaks
    assert tensor.numel() * tensor.element_size() <= allocated <= reserved


def test_the_workspace_probe_sees_cublas_workspaces_torch_sizes() -> None:
    import torch

    from autotune.runtime import _device as dev

    held = dev.blas_workspace(torch.device("cuda"))
    query = getattr(torch.backends.cuda, "cublas_workspace_size", None)  # torch >= 2.13
    major = torch.cuda.get_device_capability()[0]
    default = 32 * 2**20 if major in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8
    size = query() if query else default  # torch's figure per handle (CublasHandlePool.cpp)
    assert size <= held <= 4 * size  # the forward's handle and autograd's, each with cuBLASLt's


def test_the_model_file_estimate_holds_what_a_real_cuda_step_allocates(examples_dir: Path) -> None:
    from autotune import compose
    from autotune.estimator import estimate_plan
    from autotune.records import Plan

    model = examples_dir / "tiny_llama.py"
    facts = compose.model_file_facts(model, ("fp32",), "cuda")
    assert facts.device_workspace > 0 and "measured" in (facts.device_workspace_source or "")
    predicted = estimate_plan(facts, Plan(micro_batch=2)).memory.peak
    record = compose.profile_model(model, batch_size=2, steps=1, warmup=1, device="cuda")
    assert record.environment.blas_workspace_bytes == facts.device_workspace
    assert abs(predicted / record.memory.peak - 1) <= 0.02  # torch.cuda.max_memory_allocated


def test_profile_on_cuda_reads_the_allocator_the_table_and_nvml(examples_dir: Path) -> None:
    from autotune.runtime.profiler import profile

    record = profile(examples_dir / "tiny_llama.py", batch_size=4, steps=3, warmup=1,
                     device="cuda", precision="bf16", checkpointing=True)  # fmt: skip
    memory, compute = record.memory, record.compute
    assert memory.peak_source == "cuda_max_allocated"
    assert memory.fits_judged_on == "memory.peak (torch.cuda.max_memory_allocated)"
    assert memory.cuda_reserved is not None and memory.cuda_reserved >= memory.peak
    assert record.environment.device_type == "cuda" and record.environment.cuda_version
    if compute.peak_source == "table":  # a GPU in the table: MFU is a share of its datasheet peak
        assert compute.mfu is not None and 0 < compute.mfu < 1
    else:
        assert "compute.peak_flops_per_s" in record.environment.unavailable
    nvml = record.environment.nvml
    assert nvml is not None or "nvml" in record.environment.unavailable
    # the block stack's share of the forward, timed with the device synchronized, at bf16 and
    # at its fp32 counterpart
    shares = record.time.block_forward_share
    assert set(shares) == {"bf16", "fp32"} and all(0 < v <= 1 for v in shares.values())


# Every way a trial trains on a GPU: autocast bf16 / fp16 (GradScaler), DeepSpeed bf16 / fp16
# weights (fp16 with dynamic loss scaling), and torch.compile.
TRIAL_PLANS = {
    "amp_bf16": ("precision=amp_bf16", "torch"),
    "amp_fp16": ("precision=amp_fp16", "torch"),
    "ds_bf16": ("precision=bf16", "deepspeed"),
    "ds_fp16": ("precision=fp16", "deepspeed"),
    "compile": ("precision=amp_bf16,compile=true", "torch"),
}

OOM_MODEL = """
import torch

def build_model():
    return torch.nn.Linear(8, 1)

def build_batch(batch_size):
    return torch.randn(batch_size, 8)

def loss_fn(model, batch):
    total = torch.cuda.get_device_properties(batch.device).total_memory
    waste = torch.empty(2 * total, dtype=torch.uint8, device=batch.device)  # can never fit
    return model(batch).mean() + waste[:1].float().sum()
"""


@pytest.fixture(scope="module")
def cuda_trials(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plans above and a real out-of-memory, run at once as separate trial processes."""
    from autotune.records import Plan, parse_plan
    from autotune.runtime.trial.entry_points import ENTRY_POINTS
    from autotune.search import SubprocessRunner, TrialSettings

    folder = tmp_path_factory.mktemp("cuda-trials")
    oom_model = folder / "oom.py"
    oom_model.write_text(OOM_MODEL)
    runner = SubprocessRunner(entry_points=ENTRY_POINTS, workdir=folder)
    tiny = str(EXAMPLES / "tiny_llama.py")
    jobs = {name: (parse_plan(text, Plan(micro_batch=2), "plan"), tiny)
            for name, (text, _) in TRIAL_PLANS.items()}  # fmt: skip
    jobs["oom"] = (Plan(micro_batch=2), str(oom_model))

    def run(job: tuple[Plan, str]) -> Any:
        plan, model = job
        settings = TrialSettings(model_file=model, steps=2, warmup=1, device="cuda", timeout_s=240)
        return runner.run(plan, settings)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(run, jobs.values()), strict=True))


@pytest.mark.parametrize("name", list(TRIAL_PLANS))
def test_trials_train_on_the_gpu_in_every_precision(cuda_trials: dict[str, Any], name: str) -> None:
    from autotune.search._outcome import classify_outcome

    report = cuda_trials[name]
    result = report.result
    outcome = classify_outcome(report.returncode, report.timed_out, result, report.stderr_tail)
    assert outcome == "ok", report.stderr_tail[-3000:]
    assert result.engine == TRIAL_PLANS[name][1]
    assert result.peak_source == "cuda_max_allocated" and result.peak > 0
    assert result.loss_first is not None and math.isfinite(result.loss_first)
    assert result.loss_last is not None and math.isfinite(result.loss_last)


def test_a_real_cuda_out_of_memory_is_classified_oom(cuda_trials: dict[str, Any]) -> None:
    from autotune.search._outcome import classify_outcome, outcome_reason

    report = cuda_trials["oom"]
    outcome = classify_outcome(
        report.returncode, report.timed_out, report.result, report.stderr_tail
    )
    assert outcome == "oom", report.stderr_tail[-3000:]
    reason = outcome_reason(outcome, report.result, report.stderr_tail)
    assert reason is not None and "out of memory" in reason.lower()
